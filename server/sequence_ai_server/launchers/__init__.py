"""How a worker is started and watched: the launcher interface (base.py), the local subprocess
launcher, per-deployment environments and the Ray launcher."""
