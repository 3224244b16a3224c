"""Sources of desired ingresses: the coordinator push API and ingress files."""
