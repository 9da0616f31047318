"""kvforge.templates: the Jinja2 kernel templates and the shared device headers (package data)."""
