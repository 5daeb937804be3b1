"""Syntax: the grammar, the parser and the AST of ``.place`` files."""
