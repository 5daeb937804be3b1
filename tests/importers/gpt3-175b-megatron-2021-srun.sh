#!/bin/bash
# GPT-3 175B on 128 DGX A100 nodes, launched the way Megatron-LM's examples/pretrain_gpt3_175B.sh
# of 2021-01 (NVIDIA/Megatron-LM 152aab304d) launches it: Slurm directives on one #SBATCH line,
# the arguments gathered in a string, one srun task per GPU running pretrain_gpt.py through
# `sh -c`. Paths are this fixture's own.

#SBATCH --job-name=gpt3_175b --nodes=128 --exclusive --ntasks-per-node=8

DIR=`pwd`
DATASET="0.5 /data/web_text_document 0.5 /data/books_text_document"

options=" \
	--tensor-model-parallel-size 8 \
	--pipeline-model-parallel-size 16 \
	--num-layers 96 \
	--hidden-size 12288 \
	--num-attention-heads 96 \
	--seq-length 2048 \
	--max-position-embeddings 2048 \
	--micro-batch-size 1 \
	--global-batch-size 1536 \
	--train-samples 146484375 \
	--lr 6.0e-5 \
	--data-path ${DATASET} \
	--vocab-file /data/gpt2-vocab.json \
	--merge-file /data/gpt2-merges.txt \
	--clip-grad 1.0 \
	--weight-decay 0.1 \
	--fp16 \
	--checkpoint-activations "

run_cmd="python -u ${DIR}/pretrain_gpt.py ${options}"

srun -l --container-image "nvcr.io/nvidia/pytorch:20.12-py3" --output=$DIR/logs/%x_%j.log sh -c "${run_cmd}"
