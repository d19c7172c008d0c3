"""The systems `make bench-peers` sets beside streamberg (bench/peers.py). Each script runs in
a virtualenv of its own (the peers never enter the product's dependencies) and imports
nothing of streamberg: what a user of that system would write."""
