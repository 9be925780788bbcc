"""Shuffle sharding: `k8s.io/apiserver/pkg/util/shufflesharding/shufflesharding.go`.

A flow's hash picks a hand of `hand_size` distinct queues out of `deck_size`, the same hand for the
same hash, so one flow can fill at most its hand and two flows rarely share a whole hand.
"""

from __future__ import annotations

import math

MAX_HASH_BITS = 60


def required_entropy_bits(deck_size: int, hand_size: int) -> int:
    return math.ceil(math.log2(deck_size) * hand_size)


class DealerError(ValueError):
    """`NewDealer`'s refusals, in its words."""


class Dealer:
    __slots__ = ("deck_size", "hand_size")

    def __init__(self, deck_size: int, hand_size: int) -> None:
        if deck_size <= 0 or hand_size <= 0:
            raise DealerError(f"deckSize {deck_size} or handSize {hand_size} is not positive")
        if hand_size > deck_size:
            raise DealerError(f"handSize {hand_size} is greater than deckSize {deck_size}")
        if deck_size > 1 << 26:
            raise DealerError(f"deckSize {deck_size} is impractically large")
        if required_entropy_bits(deck_size, hand_size) > MAX_HASH_BITS:
            raise DealerError(
                f"required entropy bits of deckSize {deck_size} and handSize {hand_size} is greater than {MAX_HASH_BITS}"
            )
        self.deck_size = deck_size
        self.hand_size = hand_size

    def deal(self, hash_value: int) -> list[int]:
        """`DealIntoHand`: the hand's cards, in the order dealt."""
        remainders = []
        deck = self.deck_size
        for i in range(self.hand_size):
            hash_value, remainder = divmod(hash_value, deck - i)
            remainders.append(remainder)
        hand = []
        for i, card in enumerate(remainders):
            for j in range(i, 0, -1):
                if card >= remainders[j - 1]:
                    card += 1
            hand.append(card)
        return hand
