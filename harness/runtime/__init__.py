"""The runtime: the World of rank processes, a rank's side, torchrun (spmd), the gloo device, placement, timing, byte
counting and what the machine can do (capabilities)."""
