"""The payment service played locally: the whole interface served by aiohttp, on virtual time."""
