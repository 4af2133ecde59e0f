"""mqdashboard: a web dashboard for trimq clusters (docs/dashboard.md)."""
