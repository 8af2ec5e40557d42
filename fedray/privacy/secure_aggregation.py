"""Secure aggregation, simulated (``privacy.secure_aggregation``; docs/guide/privacy.md, 'Secure aggregation').

No cryptography runs: fedray's workers already reduce a cohort's ``sums`` before the server reads them,
which is what the server of SecAgg (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving
Machine Learning", CCS 2017) and SecAgg+ (Bell et al., "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020) learns. What is modelled:

- the dropout threshold t (``threshold``): the sum is unmasked only when at least t clients report
  (Bonawitz et al. §4: the server needs t shares of each dropped client's mask key); a round with fewer
  fails (:func:`survivor_threshold`);
- distributed DP (``noise: distributed``, Kairouz et al., "The Distributed Discrete Gaussian Mechanism
  for Federated Learning with Secure Aggregation", ICML 2021, §3): each of the m planned clients adds
  N(0, σ²/m) to its upload, so the sum of m carries the central N(0, σ²); with d of them dropped it
  carries (m − d)/m·σ², i.e. the noise multiplier z·√((m − d)/m) (:func:`realised_noise_multiplier`);
- the cost per client and round (:func:`client_bytes`, :data:`PROTOCOL_ROUNDS`), from the protocols'
  messages with k neighbours per client: k = n − 1 under SecAgg (every pair of the n clients agrees
  keys: O(n) bytes per client, Bonawitz et al. §6.1), k = O(log n) under SecAgg+ (a random k-regular
  graph, Bell et al. §3, Table 1: O(log n + L) client communication):

      B(k) = 2·P + k·(2·P + 2·E + S)

  with P = :data:`PUBLIC_KEY_BYTES` (the two public keys each client advertises and receives from each
  neighbour: AdvertiseKeys), E = :data:`CIPHERTEXT_BYTES` (the encrypted pair of Shamir shares sent to
  and received from each neighbour: ShareKeys) and S = :data:`SHARE_BYTES` (one share per neighbour
  revealed in Unmasking). The masked input itself (MaskedInputCollection) is the client's upload, in a
  ring of 2³² elements as the clock's 4 bytes per float: counted in ``bytes_up`` as without masking.
"""

from __future__ import annotations

import math

from fedray.config.privacy import SecureAggregationConfig

#: Bytes of an elliptic-curve (X25519) public key; each client advertises two (c_pk, s_pk).
PUBLIC_KEY_BYTES = 32
#: Bytes of one Shamir share of a 256-bit secret (an element of a 256-bit field).
SHARE_BYTES = 32
#: Bytes of one encrypted pair of shares (of b_u and s_sk) with both client ids (4 bytes each) and an AEAD nonce and tag (12 + 16).
CIPHERTEXT_BYTES = 2 * SHARE_BYTES + 2 * 4 + 12 + 16
#: The semi-honest protocol's rounds: AdvertiseKeys, ShareKeys, MaskedInputCollection, Unmasking
#: (Bonawitz et al. 2017, Fig. 1; SecAgg+ keeps them, Bell et al. §4).
PROTOCOL_ROUNDS = 4


def neighbours(config: SecureAggregationConfig, clients: int) -> int:
    """k, the clients each of ``clients`` = n agrees keys with: n − 1 under SecAgg; under SecAgg+
    ``privacy.secure_aggregation.degree`` or min(n − 1, ⌈2·log₂ n⌉), fedray's choice of Bell et al.'s k = O(log n)."""
    if clients <= 1:
        return 0
    if config.protocol == "secagg":
        return clients - 1
    degree = config.degree if config.degree is not None else math.ceil(2 * math.log2(clients))
    return min(clients - 1, degree)


def client_bytes(config: SecureAggregationConfig, clients: int) -> int:
    """B(k) (module docstring): the bytes one of ``clients`` clients sends and receives for the protocol
    besides its masked upload (the ``secagg_bytes_per_client`` column)."""
    k = neighbours(config, clients)
    return 2 * PUBLIC_KEY_BYTES + k * (2 * PUBLIC_KEY_BYTES + 2 * CIPHERTEXT_BYTES + SHARE_BYTES)


def survivor_threshold(config: SecureAggregationConfig, cohort: int) -> int:
    """t: ``threshold`` · m rounded up for a fraction (<= 1) of the cohort m = ``train.clients_per_round``, else the count."""
    if config.threshold <= 1:
        return math.ceil(config.threshold * cohort - 1e-9)
    return int(config.threshold)


def realised_noise_multiplier(noise_multiplier: float, reporting: int, cohort: int) -> float:
    """z·√(n/m): the multiplier of the noise the sum of ``reporting`` = n clients' shares carries, each
    share planned for a cohort of m (module docstring)."""
    return noise_multiplier * math.sqrt(reporting / cohort)
