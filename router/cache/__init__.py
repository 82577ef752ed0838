"""The cache model, shared by the live proxy and the offline simulator: block hashing, the
block-hash LRU and radix-tree shadows, a worker's load and booking, the KV-event index, and
the correction of shadows from what workers report."""
