#!/bin/bash
# GPT-3 175B on 1024 GPUs, Megatron-LM's 3D layout (Narayanan et al. 2021, Table 1 row 175B-like).
# Flags: megatron/training/arguments.py and megatron/core/model_parallel_config.py.
GPUS_PER_NODE=8
NUM_NODES=128
TP=8
CHECKPOINT_PATH=$1

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --tokenizer-type GPT2BPETokenizer
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1024
    --lr 6.0e-5
    --clip-grad 1.0
    --bf16
    --use-distributed-optimizer
    --recompute-granularity selective
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size 8
    --sequence-parallel
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --save $CHECKPOINT_PATH \
    --overlap-grad-reduce
