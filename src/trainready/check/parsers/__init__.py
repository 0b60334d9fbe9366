"""Parsers for the text that node commands print (nvidia-smi, ...), one module per tool.

Every parser takes the raw output and never raises: it returns what it could read plus `problems`,
a list of strings naming each line it could not make sense of.
"""
