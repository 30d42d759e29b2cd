"""The base layer: errors, settings, warnings, the trace record, and the one seam up.

Owns the exceptions (``exceptions``), the settings and their blocks (``config``), warnings that point at the
user's line (``_warn``), the record of what ran where (``trace``), the mark of functions saved files may
call (``saved``) and the registry through which lower layers reach user-facing verbs at run time
(``verbs``).  Imports nothing from gpunets: every other package may import it.
"""
