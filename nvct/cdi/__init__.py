"""The Container Device Interface: specs on disk, and nvct's use of them.

* :mod:`nvct.request.cdinames` -- kinds (``vendor/class``) and device names;
* :mod:`nvct.cdi.version` and :mod:`nvct.cdi.schema` -- what each ``cdiVersion``
  allows, and the lowest version a spec needs;
* :mod:`nvct.cdi.spec` -- reading, validating and writing one spec file;
* :mod:`nvct.cdi.registry` -- the spec directories, and resolving device names
  to container edits;
* :mod:`nvct.cdi.generate` -- a spec for this node's GPUs (``nvct cdi generate``);
* :mod:`nvct.cdi.transform` -- moving a spec's paths to another root;
* :mod:`nvct.cdi.modes` -- the shim's ``cdi`` mode.

Only the standard library is imported up front: the shim resolves CDI names on
container starts. PyYAML is loaded when a YAML spec is read or written.
"""
