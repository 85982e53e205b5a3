"""Platform operations beside serving: scheduled warm floors, quotas, alerts and the card inventory."""
