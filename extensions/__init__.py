"""Built-in device extensions: one YAML manifest and one Python module each.

``transformer_engine`` (fused/flash/sparse attention), ``pim`` (processing in memory),
``photonic`` (optical matmul core) and ``analog`` (PCM crossbar, hybrid digital-analog).
Load them with :func:`wia_hw.load_extension` and register them on a context with
:func:`wia_hw.register_device_extension`; the manifests are package data.
"""
