"""Command-line interface: thin Typer commands that parse, call the library and render."""
