"""Optional runtime machinery: activations streamed to disk, Ray sharding, allocator policy."""
