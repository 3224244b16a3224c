"""Upper bounds of every list an ingress carries (documented in docs/ingress.md).

No request can make the exporter do unbounded work: each list has its bound here.
"""

MAX_HOSTS = 32
MAX_SERVERS = 256
MAX_INSTANCES = 64
MAX_ENTRYPOINTS = 16
MAX_ALLOWED_IPS = 64
MAX_HEADERS = 32
MAX_INGRESSES_PER_REQUEST = 1000
MAX_CA_PEM_BYTES = 64 * 1024
MAX_MIDDLEWARES = 16
MAX_TLS_DOMAINS = 16
