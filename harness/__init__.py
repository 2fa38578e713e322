"""paritybench's harness: the World that runs ranks (``runtime``), the command line (``cli``), the pytest plugin
(``pytest``), the records (``records``: results, registry, findings), one verdict mechanism (``verdict``), the
contracts, each paradigm's folder (its ``PARADIGM`` record: ``paradigm``) and the adapters by vendor."""

from reference.aliases import install as _install

from .moved import MOVED as _MOVED

_install(_MOVED)  # the moved modules' old names stay importable (harness/moved.py)
