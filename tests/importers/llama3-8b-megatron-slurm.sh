#!/bin/bash
# Llama 3 8B (meta-llama/Meta-Llama-3-8B's config.json: 32 layers, hidden 4096, ffn 14336,
# 32 heads, 8 KV heads, vocabulary 128256) on SLURM nodes of 8 GPUs. The shape of Megatron-LM's
# examples/llama scripts: flag arrays, a static DTYPE test, arguments with defaults.
# Flags: megatron/training/arguments.py and megatron/core/model_parallel_config.py.
CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b"}
DTYPE=${2:-"bf16"}
mkdir -p "$(dirname "$CHECKPOINT_PATH")"

GPUS_PER_NODE=8
NNODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | wc -l)

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
)

MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --swiglu --normalization RMSNorm --disable-bias-linear
    --untie-embeddings-and-output-weights --position-embedding-type rope
    --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256
)

TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 256
    --use-distributed-optimizer
)
if [[ "$DTYPE" == "fp8" ]]; then
    TRAINING_ARGS+=( "--bf16" "--fp8-format hybrid" )
elif [ "$DTYPE" = "bf16" ]; then
    TRAINING_ARGS+=( "--bf16" )
else
    TRAINING_ARGS+=( "--fp16" )
fi

PARALLEL_ARGS=( "--tensor-model-parallel-size 2" --pipeline-model-parallel-size 2 )

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${PARALLEL_ARGS[@]} \
    --save "$CHECKPOINT_PATH"
