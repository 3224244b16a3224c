"""What Traefik actually serves: its API (beacon, broken routers), its decoder's traps, and the observer."""
