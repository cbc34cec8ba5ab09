"""Target-aware search for the best artifact a device profile accepts (``edgeopt optimize``)."""
