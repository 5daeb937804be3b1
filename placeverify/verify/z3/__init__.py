"""The Z3-only helpers of verification: running the solver (``solve``), count variables
(``counts``), the gradient-integrity encoding (``integrity``), the counterexample search
(``search``) and float32 witnesses (``float32``)."""
