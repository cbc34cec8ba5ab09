"""``edgeopt fleet``: many models × many device targets, each pair optimized, bundled and reported, on this host
or as Ray tasks on a cluster, with clean measurement slots."""
