from optimize.stages.s6_quantize.carry import node_role, nodes_for_roles

MINILM = ["Attention_0", "/model/encoder/layer.0/attention/output/dense/MatMul",
          "/model/encoder/layer.0/intermediate/dense/MatMul", "/model/encoder/layer.0/output/dense/MatMul"]
DISTILBERT = ["Attention_0", "/model/distilbert/transformer/layer.0/attention/out_lin/MatMul",
              "/model/distilbert/transformer/layer.0/ffn/lin1/MatMul",
              "/model/distilbert/transformer/layer.0/ffn/lin2/MatMul", "/model/pre_classifier/Gemm_MatMul"]


def test_bert_and_distilbert_nodes_map_to_the_same_roles():
    roles = [node_role(n) for n in MINILM]
    assert roles == [(0, "attention_qkv"), (0, "attention_output"), (0, "ffn_in"), (0, "ffn_out")]
    assert [node_role(n) for n in DISTILBERT[:4]] == roles
    assert node_role("/model/encoder/layer.11/attention/self/query/MatMul") == (11, "attention_qkv")


def test_a_recipe_carries_layer_roles_and_keeps_heads_float():
    kept = nodes_for_roles(DISTILBERT, {(0, "ffn_out"), (3, "ffn_in")})
    assert kept == ["/model/distilbert/transformer/layer.0/ffn/lin2/MatMul", "/model/pre_classifier/Gemm_MatMul"]


def test_outlier_channel_counts_carry_by_role():
    from optimize.stages.s6_quantize.carry import OutlierLimits, node_role

    limits = OutlierLimits({node_role(MINILM[2]): 5, node_role(MINILM[3]): 16})
    assert limits.for_nodes(DISTILBERT) == {DISTILBERT[2]: 5, DISTILBERT[3]: 16}


def test_calibration_texts_are_not_the_probes():
    from optimize.tasks import task_for

    for task in ("feature-extraction", "sequence-classification", "ranking", "token-classification"):
        calibration, probes = task_for(task).calibration(), task_for(task).probes()
        assert len(calibration) >= 10 and not set(calibration) & set(probes)
