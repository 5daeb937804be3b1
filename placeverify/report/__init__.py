"""Reports: the content as plain data (JSON) and its rendering as text."""
