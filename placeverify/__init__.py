"""placeverify: placement semantics for distributed training (arXiv 2601.02311).

Pipeline: ``.place`` text -> parse tree -> AST -> IR -> {SymPy costs, Z3 obligations} -> report
-> CLI. The torch replay and measure backends sit beside it and are the only code importing torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
