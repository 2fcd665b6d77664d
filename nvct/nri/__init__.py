"""The GPU Operator's NRI mode: a plugin that injects the CDI devices a pod's annotation names.

With ``ENABLE_NRI_PLUGIN`` the toolkit installer writes no engine config;
instead it registers with the runtime's NRI socket and answers each
CreateContainer with the CDI device names of the pod annotation
``nvidia.cdi.k8s.io/container.<name>`` (the runtime resolves them in its CDI
spec directories). :mod:`.wire` is the protobuf subset, :mod:`.ttrpc` the
framing, :mod:`.messages` the NRI messages, :mod:`.plugin` the plugin.
See docs/installer.md.
"""
