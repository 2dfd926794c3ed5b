#!/bin/bash

# A small Mixtral-style MoE run, in the shape of Megatron-LM's Mixtral example.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=4
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
NNODES=${SLURM_NNODES:-"1"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
TOKENIZER_MODEL=/workspace/tokenizer.model

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr $MASTER_ADDR
)

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 256
    --max-position-embeddings 4096
    --num-layers 2
    --hidden-size 128
    --ffn-hidden-size 448
    --num-attention-heads 4
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 2
    --no-masked-softmax-fusion
    --no-position-embedding
    --rotary-base 1000000
)

MOE_ARGS=(
    --num-experts 4
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
#    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --mock-data
    #--data-path $DATA_PATH
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 8
    --lr 1e-4
    --train-iters 20
    # --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    --clip-grad 1.0
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --expert-model-parallel-size 2
    --use-distributed-optimizer
)

LOGGING_ARGS=(
  #  --log-interval 1 \
    --eval-iters 10 \
    #--save $CHECKPOINT_PATH \
    --no-load-optim \
    --no-load-rng
)

if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${WANDB_PROJECT:-"Mixtral"}
    )
fi

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]}
