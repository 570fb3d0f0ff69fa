"""Candidate trees: builders, masks and retrieve indices on hand-checked trees; one tree-attention
pass gives the same logits as feeding every root-to-leaf path on its own."""

import pytest
import torch

from specdec_lab.samplers.tree import Tree, TreeDecoder, cartesian, chain, sparse


class TestTreeFromChoices:
    def test_hand_checked_tree(self):
        # root ─ [0] ─ [0,0]
        #      │     └ [0,1]
        #      └ [1]
        tree = Tree.from_choices([[0], [0, 0], [1], [0, 1]])
        assert tree.paths == ((0,), (1,), (0, 0), (0, 1))
        assert tree.parents == (-1, 0, 0, 1, 1)
        assert tree.depths == (0, 1, 1, 2, 2)
        assert tree.ranks == (0, 0, 1, 0, 1)
        assert tree.position_ids.tolist() == [0, 1, 1, 2, 2]
        assert tree.children.tolist() == [[1, 2], [3, 4], [-1, -1], [-1, -1], [-1, -1]]
        assert tree.retrieve_indices.tolist() == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]
        assert tree.attention_mask.int().tolist() == [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 0, 0, 1],
        ]
        assert tree.max_children() == [2, 2]

    @pytest.mark.parametrize("choices, message", [
        ([], "at least one"),
        ([[0], [0]], "duplicated"),
        ([[0, 0]], "no parent"),
        ([[0], [2]], "without gaps"),
        ([[-1]], "negative"),
    ])
    def test_bad_choices(self, choices, message):
        with pytest.raises(ValueError, match=message):
            Tree.from_choices(choices)


class TestBuilders:
    def test_chain(self):
        tree = chain(3)
        assert tree.paths == ((0,), (0, 0), (0, 0, 0))
        assert tree.retrieve_indices.tolist() == [[0, 1, 2, 3]]
        assert torch.equal(tree.attention_mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
        with pytest.raises(ValueError, match="depth"):
            chain(0)

    def test_cartesian(self):
        tree = cartesian([3, 2])
        assert tree.num_nodes == 3 + 6 and tree.depth == 2
        assert len(tree.retrieve_indices) == 6
        assert tree.max_children() == [3, 2]

    def test_sparse_is_most_probable_paths(self):
        tree = sparse([[0.6, 0.2], [0.4, 0.1]], 4)
        assert tree.paths == ((0,), (1,), (0, 0), (1, 0))  # 0.6, 0.2, 0.24 > 0.08 (1,0) > 0.06 (0,1)
        with pytest.raises(ValueError, match="non-increasing"):
            sparse([[0.2, 0.6]], 2)


@pytest.mark.parametrize("tree", [chain(3), cartesian([2, 2]), Tree.from_choices([[0], [1], [2], [0, 0], [1, 0]])],
                         ids=["chain3", "cartesian2x2", "sparse5"])
def test_tree_pass_equals_per_path_forwards(pair, prompt, tree):
    """One forward over root + all nodes with tree attention == each path fed alone (fp32)."""
    gen = torch.Generator().manual_seed(3)
    B = 3
    decoder = TreeDecoder(pair.target, pair.vocab_size, B, pair.device)
    decoder.prefill_state(prompt[:-1])
    tokens = torch.randint(0, pair.vocab_size, (B, tree.num_nodes + 1), generator=gen)
    tokens[:, 0] = prompt[-1]
    logits, _ = decoder.feed_tree(tokens, tree)  # (B, N+1, V)
    for path in tree.retrieve_indices.tolist():
        nodes = [i for i in path if i >= 0]
        for b in range(B):
            seq = torch.cat([prompt, tokens[b, nodes[1:]]])
            with torch.no_grad():
                alone = pair.target(seq[None]).logits[0, -len(nodes):, : pair.vocab_size].double()
            torch.testing.assert_close(logits[b, nodes], alone, atol=1e-4, rtol=1e-5)  # fp32 batch noise; logits are O(10)


def test_keep_path_restores_plain_context(pair, prompt):
    """After keeping only the root and one path, the next plain feed sees exactly that text."""
    tree = cartesian([2, 2])
    decoder = TreeDecoder(pair.target, pair.vocab_size, 1, pair.device)
    decoder.prefill_state(prompt[:-1])
    tokens = torch.tensor([[int(prompt[-1]), 5, 6, 7, 8, 9, 10]])
    decoder.feed_tree(tokens, tree)
    path = tree.retrieve_indices[2].tolist()  # root, node 2, node 5
    kept = torch.zeros(1, tree.num_nodes + 1, dtype=torch.bool)
    kept[0, path] = True
    decoder.keep_path(kept)
    after = decoder.feed(torch.tensor([[11]]))[0, -1]
    seq = torch.cat([prompt, tokens[0, path[1:]], torch.tensor([11])])
    with torch.no_grad():
        alone = pair.target(seq[None]).logits[0, -1, : pair.vocab_size].double()
    torch.testing.assert_close(after, alone, atol=1e-4, rtol=1e-5)  # fp32 batch noise; logits are O(10)
