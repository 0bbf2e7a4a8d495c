"""Reports: plots (PNG) and, later, console tables, JSON/CSV export and HTML/Markdown reports."""
