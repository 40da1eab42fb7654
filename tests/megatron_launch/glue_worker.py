"""One rank of the end-to-end glue check (CPU, gloo); run as a subprocess per rank.

Usage: python glue_worker.py MEGATRON_LM REPO PREFIX OUT_JSON TP [FLAG ...] (env: RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); PREFIX: the --data-path words, space-separated (a blend:
"W1 P1 W2 P2"), or "-" for no --data-path (--mock-data among the FLAGs). With the Megatron-LM checkout on sys.path:
check_startup -> Megatron's parse_args/validate_args/set_global_variables -> our
zeppelin_gpt_builder (start-up checks, Zeppelin group, model with our spec) ->
train_valid_test_datasets_provider -> forward_step + loss_func for 3 micro-steps, each
compared with a plain megatron-core model (local spec, same weights) running the
micro-step's sequences one at a time. CPU accommodations come from cpu_support only.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    megatron_lm, repo, prefix, out_path, tp = sys.argv[1:6]
    extra = sys.argv[6:]  # more flags (later ones override the defaults below)
    # Appended: `megatron` is a namespace package, so megatron.core comes from the installed
    # megatron-core and only megatron.training (absent from the wheel) from the checkout.
    sys.path.insert(0, repo)
    sys.path.append(megatron_lm)
    import torch
    import torch.distributed as dist

    try:
        from megatron.training.arguments import parse_args, validate_args
    except ImportError as exc:
        print(f"SKIP megatron.training does not import here: {exc!r}")
        return
    import megatron.training.arguments as megatron_arguments
    from megatron.training.global_vars import set_global_variables

    # CPU accommodation (this worker only): validate_args asks the GPU's architecture when TP > 1.
    megatron_arguments.get_device_arch_version = lambda: 9  # Hopper

    from zeppelin_megatron.megatron import pretrain as zp
    from zeppelin_megatron.megatron.cpu_support import causal_mask, init_parallel_state, megatron_on_cpu

    rank, world, lws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    n_ranks = world // int(tp)
    argv = ["pretrain_gpt.py", "--zeppelin", "--zeppelin-cluster", f"{world // lws}x{lws}", "--zeppelin-prefetch", "1",
            "--tensor-model-parallel-size", tp,
            "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
            "--num-query-groups", "2", "--ffn-hidden-size", "128", "--swiglu", "--normalization", "RMSNorm",
            "--position-embedding-type", "rope", "--seq-length", "48", "--max-position-embeddings", "64",
            "--micro-batch-size", "1", "--global-batch-size", str(n_ranks), "--train-iters", "3", "--lr", "1e-4",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "500",
            *(["--data-path", *prefix.split()] if prefix != "-" else []),
            "--eval-iters", "0",
            "--transformer-impl", "local", "--no-rope-fusion", "--no-persist-layer-norm",
            "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
            "--use-cpu-initialization", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--untie-embeddings-and-output-weights", "--seed", "7", "--log-interval", "1",
            "--zeppelin-backend", "reference", *extra]
    if "--train-samples" in extra:  # sample-based training (a batch-size ramp-up needs it): no --train-iters
        at = argv.index("--train-iters")
        del argv[at:at + 2]
    sys.argv = zp.check_startup(argv, env=dict(os.environ), exit_on_error=False)
    args = parse_args(extra_args_provider=zp.extra_args_provider(), ignore_unknown_args=False)
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    set_global_variables(args)
    dist.init_process_group("gloo")
    init_parallel_state(int(tp))
    lines: list[str] = []
    result: dict = {}
    with megatron_on_cpu():
        torch.manual_seed(0)
        model = zp.zeppelin_gpt_builder(args, True, True)
        run = zp._run()
        assert run.recorder is not None
        run.recorder.writer.log = lines.append  # capture the metric lines (print_rank_last otherwise)
        train, valid, test = zp.train_valid_test_datasets_provider([6, 0, 0])
        from megatron.training import get_tokenizer
        eod = get_tokenizer().eod
        assert (valid is None) == (args.eval_iters == 0)
        assert (test is None) != bool(args.mock_data and args.eval_iters)  # mock data's 1,1,1 split has a test share
        if test is not None:
            test.close()
        held_out = [] if valid is None else [[d.first_document, d.end_document] for d in
                                             getattr(valid.dataset, "datasets", [valid.dataset])]
        if valid is not None:
            valid.close()

        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.training.arguments import core_transformer_config_from_args

        ref = GPTModel(config=core_transformer_config_from_args(args), transformer_layer_spec=get_gpt_layer_local_spec(
            normalization="RMSNorm"), vocab_size=args.padded_vocab_size, max_sequence_length=64,
            share_embeddings_and_output_weights=False, position_embedding_type="rope")
        missing = ref.load_state_dict(model.state_dict(), strict=False)
        assert not missing.missing_keys, missing.missing_keys

        megatron_mock = None  # --mock-data: megatron-core's own mock documents, to check the tokens read against
        if args.mock_data:
            from megatron.core.datasets.gpt_dataset import MockGPTLowLevelDataset
            megatron_mock = MockGPTLowLevelDataset(get_tokenizer())

        steps = []
        for _ in range(3):
            out, loss_fn = zp.forward_step(train, model)
            loss, ntok, report = loss_fn(out)
            loss.backward()
            batch_plan = model._zeppelin_binding.attention[0].step.plan
            totals = torch.tensor([float(loss), float(ntok)], dtype=torch.float64)
            dist.all_reduce(totals, group=run.group.pg)  # over the Zeppelin (data-parallel) ranks
            # reference: the same micro-step's sequences, one at a time, on a plain megatron-core model
            seq_ids = train.sampler.micro_step(len(steps))
            ref_loss = 0.0
            masked = 0  # inputs that are the end-of-document token (what --eod-mask-loss leaves out)
            with torch.no_grad():
                for s in seq_ids:
                    n = int(train.dataset.lengths[s])
                    tok, lab = train.dataset.read(int(s), 0, n)
                    if megatron_mock is not None:
                        doc = megatron_mock[int(train.dataset.documents[s])]
                        assert (tok == doc[:n]).all() and (lab == doc[1:n + 1]).all(), f"mock sequence {s}"
                    masked += int((tok == eod).sum())
                    per_tok = ref(torch.from_numpy(tok)[None], torch.arange(n)[None], causal_mask(n),
                                  labels=torch.from_numpy(lab)[None])
                    if args.eod_mask_loss:  # Megatron's dataset: no loss where the input is end-of-document
                        per_tok = per_tok * torch.from_numpy(tok != eod)[None]
                    ref_loss += float(per_tok.double().sum())
            steps.append({"loss_sum": float(totals[0]), "tokens": int(totals[1]), "ref_loss_sum": ref_loss,
                          "plan_tokens": batch_plan.total_tokens, "report": [float(x) for x in report["lm loss"]],
                          "local_tokens": int(ntok), "seq_ids": [int(s) for s in seq_ids],
                          "eod_inputs": masked if args.eod_mask_loss else 0})
        train.close()
    trained = [[d.first_document, d.end_document] for d in getattr(train.dataset, "datasets", [train.dataset])]
    # micro-steps per step: Megatron's own calculator (set up from the same args, driven as its training loop drives
    # it) and the schedule the Zeppelin step metrics group micro-steps by
    from megatron.core.num_microbatches_calculator import get_num_microbatches, update_num_microbatches
    consumed, megatron_counts = 0, []
    for _ in range(6):
        update_num_microbatches(consumed, consistency_check=True)
        megatron_counts.append(get_num_microbatches())
        consumed += megatron_counts[-1] * args.micro_batch_size * args.data_parallel_size
    schedule = run.setup.parallel.schedule
    schedule_counts = [schedule.locate(m)[2] for m in range(sum(megatron_counts)) if schedule.locate(m)[1] == 0]
    result = {"rank": rank, "steps": steps, "eod": int(eod), "parts": list(train.dataset.parts), "trained": trained,
              "held_out": held_out, "metric_lines": lines, "megatron_counts": megatron_counts,
              "schedule_counts": schedule_counts,
              "group": [run.group.rank, run.group.size], "describe": run.setup.describe()}
    with open(out_path, "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
