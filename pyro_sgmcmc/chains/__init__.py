"""The chains room: per-chain random streams, minibatch sampling and keyed permutations.

Every chain ``c`` of a run with ``seed`` draws its noise and minibatches from streams keyed by
``(seed, c)`` (:mod:`pyro_sgmcmc.chains.streams`); minibatches are slices of a keyed permutation
of each subsampled plate (:mod:`pyro_sgmcmc.chains.minibatch`, :mod:`pyro_sgmcmc.chains.permutation`).
"""
