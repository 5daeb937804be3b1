#!/bin/bash
# Mixtral 8x7B with expert parallelism (after examples/mixtral/train_mixtral_8x7b_distributed.sh);
# the model comes from --model mixtral-8x7b-config.json. The usual MoE split: experts over
# ETP 1 (whole), dense layers over TP 2 (megatron/core/parallel_state.py, initialize_model_parallel).
MOE_ARGS=(
    --num-experts 8
    --expert-model-parallel-size 8
    --moe-router-topk 2
    --moe-grouped-gemm
)
torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py \
    "${MOE_ARGS[@]}" \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
    --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1 \
    --seq-length 4096 --micro-batch-size 1 --global-batch-size 256 \
    --bf16 --use-distributed-optimizer --recompute-granularity full \
    --sequence-parallel
