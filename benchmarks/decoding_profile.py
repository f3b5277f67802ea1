"""Where a SavedModel's decoding time goes: TensorFlow ops per decoding step.

    python benchmarks/decoding_profile.py                         # the shipped en-de model, batch 1
    python benchmarks/decoding_profile.py --saved-model DIR --batch-size 32 --threads 2

Translates `--sentences` test_2016_flickr sentences (the first ones, from
`$MULTI30K_DIR`, default `../shared/data/multi30k`) through the SavedModel's
`serving_default` signature, as TF Serving runs it, in batches of
`--batch-size`: the first batch once to warm up and once under TensorFlow's
profiler, then every batch twice (a warm-up, then timed), and prints, per op type (after Grappler's rewrites: the ops that
ran), how many ran per decoding step and their kernel time. A step is one
pass of the search's while loop (its condition's `Less` op). Kernel times
add up the ops' own durations; with several threads they overlap, and the
executor's bookkeeping between ops is not in them: compare the total with
the batch's wall time printed beside it.

Counts do not depend on what else the machine runs; times do (a memory-bound
matrix product slows most when another process shares the cache): profile
on an idle machine for times.
"""

import argparse
import collections
import glob
import gzip
import os
import shutil
import sys
import tempfile
import time


def op_table(space, step_marker="/cond/"):
    """`(steps, {op_type: (count, picoseconds)})` of the TensorFlow ops in an
    `XSpace` (the profiler's `*.xplane.pb`).

    An op event is named `node_name:OpType`; a step is counted at each
    `Less` op whose node name contains `while/` and `step_marker` (the
    while loop's condition). Events named otherwise (the executor's and the
    thread pool's own, `ExecutorState::Process`) and whole function calls
    (`__inference_*`) are left out.
    """
    counts, picos, steps = collections.Counter(), collections.Counter(), 0
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" not in name or "::" in name:  # the executor's and thread pool's own
                    continue
                node, op = name.rsplit(":", 1)
                op = op.strip()
                if op.startswith("__inference"):  # a whole function call, its ops counted apart
                    continue
                counts[op] += 1
                picos[op] += event.duration_ps
                if op == "Less" and "while/" in node and step_marker in node:
                    steps += 1
    return steps, {op: (counts[op], picos[op]) for op in counts}


def format_table(steps, table, wall_seconds, top=30):
    """The lines `main` prints for `op_table`'s result."""
    per = max(steps, 1)
    total_ops = sum(n for n, _ in table.values())
    total_ps = sum(p for _, p in table.values())
    lines = [
        f"decoding steps: {steps}; ops: {total_ops} ({total_ops / per:.1f} a step); "
        f"kernel time {total_ps / 1e9:.1f} ms; wall time {wall_seconds * 1e3:.1f} ms",
        f"{'op':32s} {'a step':>8s} {'ms':>9s} {'us/op':>8s} {'share':>6s}",
    ]
    for op, (n, ps) in sorted(table.items(), key=lambda item: -item[1][1])[:top]:
        lines.append(f"{op:32s} {n / per:8.1f} {ps / 1e9:9.3f} {ps / n / 1e6:8.2f} {ps / max(total_ps, 1):6.1%}")
    return lines


def _sentences(data_dir, count, pair):
    source = pair.split("-")[0]
    with gzip.open(os.path.join(data_dir, f"test_2016_flickr.{source}.gz"), "rt", encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(count), f)]


def _traced(serve, batch, tf, xplane_pb2):
    log_dir = tempfile.mkdtemp(prefix="decoding_profile_")
    try:
        # Level 3: the cheap ops too, which the default level leaves out.
        tf.profiler.experimental.start(log_dir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
        serve(batch)
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)[0], "rb") as f:
            space.ParseFromString(f.read())
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return op_table(space)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saved-model", default="saved_models/multi30k-en-de")
    parser.add_argument("--pair", default=None, help="the corpus pair (default: from the folder name, else en-de)")
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", "../shared/data/multi30k"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=None, help="default: the batch size, at least 8")
    parser.add_argument("--threads", type=int, default=1,
                        help="TensorFlow inter- and intra-op threads (TF Serving's flags); 0: TensorFlow's default")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    pair = args.pair or next((p for p in ("en-de", "de-en", "en-fr") if p in args.saved_model), "en-de")
    lines = _sentences(args.data, args.sentences or max(args.batch_size, 8), pair)

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the signature)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    if args.threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    serve = tf.saved_model.load(args.saved_model).signatures["serving_default"]
    batches = [tf.constant(lines[i:i + args.batch_size]) for i in range(0, len(lines), args.batch_size)]
    serve(batches[0])  # traces and optimizes the function
    # The trace comes early: TensorFlow's executor stops recording the cheap
    # ops of a function once it has run it a number of times, and a long
    # profiler session runs out of room for events; so one batch is traced.
    steps, table = _traced(serve, batches[0], tf, xplane_pb2)
    for batch in batches:
        serve(batch)
    seconds = []
    for batch in batches:
        start = time.perf_counter()
        serve(batch)
        seconds.append(time.perf_counter() - start)
    print(f"{args.saved_model}: {len(lines)} sentences in batches of {args.batch_size} "
          f"({sum(seconds) / len(lines) * 1e3:.1f} ms a sentence), {args.threads or 'default'} thread(s); "
          f"the ops of the first batch:")
    print("\n".join(format_table(steps, table, seconds[0], args.top)))


if __name__ == "__main__":
    sys.exit(main())
