"""What every plane of the server shares: the error shape, the JSON and body-size guards, logs,
settings, the lease token and process helpers. Imports nothing else from this package."""
