"""Hardware and system probes (NVML, psutil, py-spy), installed as `distdoctor.probes`."""
