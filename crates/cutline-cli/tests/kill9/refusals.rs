//! Bad arguments: a non-zero exit and a message that says what is wrong, no panic.

use super::*;

pub(crate) fn assert_refused(ctx: &Ctx, args: &[OsString], log: &Path, fin: &Finished, must_mention: &[&str]) {
    let why = |what: &str| -> ! { ctx.fail(format!("{what}\n{}", describe_run(args, Some(fin.status), log))) };
    if fin.status.success() {
        why("expected a non-zero exit");
    }
    if fin.status.code().is_none() {
        why("expected an ordinary non-zero exit, not death by a signal");
    }
    if fin.stderr.contains("panicked") {
        why("expected an error message, not a panic");
    }
    for m in must_mention {
        if !fin.stderr.contains(m) {
            why(&format!("the error message should mention {m:?}"));
        }
    }
}

pub(crate) fn small_job(ctx: &Ctx, scratch: &Scratch) -> (PathBuf, PathBuf, PathBuf) {
    let input = scratch.path("input.txt");
    std::fs::write(&input, generate_text(ctx.seed, 2_000)).unwrap();
    (input, scratch.path("output"), scratch.path("state"))
}

#[test]
fn missing_input_file_is_refused_with_a_clear_message() {
    let ctx = Ctx { test: "missing_input_file_is_refused_with_a_clear_message", seed: seed_for(5) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let input = scratch.path("no-such-input.txt");
    let args = wordcount_args(&input, &scratch.path("output"), &scratch.path("state"), 1, "200ms", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["input", &input.display().to_string()]);
}

#[test]
fn checkpoint_interval_in_parsecs_is_refused_with_a_clear_message() {
    let ctx = Ctx { test: "checkpoint_interval_in_parsecs_is_refused_with_a_clear_message", seed: seed_for(6) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let (input, output, state) = small_job(&ctx, &scratch);
    let args = wordcount_args(&input, &output, &state, 1, "5parsecs", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["5parsecs"]);
    if !committed_parts(&output).is_empty() {
        ctx.fail("a refused run committed output");
    }
}

#[test]
fn output_path_that_is_a_regular_file_is_refused_and_the_file_is_left_alone() {
    let ctx =
        Ctx { test: "output_path_that_is_a_regular_file_is_refused_and_the_file_is_left_alone", seed: seed_for(7) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let (input, _, state) = small_job(&ctx, &scratch);
    let output = scratch.path("precious.txt");
    std::fs::write(&output, "do not touch\n").unwrap();
    let args = wordcount_args(&input, &output, &state, 1, "200ms", "exactly-once");
    let log = scratch.path("run");
    let fin = run_until(&ctx, &args, &log, Instant::now() + SHORT_RUN_TIME_LIMIT);
    assert_refused(&ctx, &args, &log, &fin, &["output", &output.display().to_string()]);
    match std::fs::read(&output) {
        Ok(b) if b == b"do not touch\n" => {}
        other => ctx.fail(format!("the regular file given as --output was changed: {other:?}")),
    }
}

#[test]
fn state_dir_of_another_job_is_refused_and_left_unchanged() {
    let ctx = Ctx { test: "state_dir_of_another_job_is_refused_and_left_unchanged", seed: seed_for(8) };
    let deadline = Instant::now() + SCENARIO_TIME_LIMIT;
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let state = scratch.path("state");
    // Job A: input X into output A, state S, run to completion.
    let (input_x, output_a) = (scratch.path("x.txt"), scratch.path("output-a"));
    std::fs::write(&input_x, generate_text(ctx.seed, 5_000)).unwrap();
    let args_a = wordcount_args(&input_x, &output_a, &state, 2, CHECKPOINT_INTERVAL, "exactly-once");
    let fin_a = run_until(&ctx, &args_a, &scratch.path("run-a"), deadline);
    if !fin_a.status.success() {
        ctx.fail(format!(
            "job A did not exit 0\n{}",
            describe_run(&args_a, Some(fin_a.status), &scratch.path("run-a"))
        ));
    }
    let state_before = snapshot(&state);
    let output_a_before = snapshot(&output_a);

    // Job B: another input and output, same state directory.
    let (input_y, output_b) = (scratch.path("y.txt"), scratch.path("output-b"));
    std::fs::write(&input_y, generate_text(ctx.seed + 1, 5_000)).unwrap();
    for (i, args_b) in [
        wordcount_args(&input_y, &output_b, &state, 2, CHECKPOINT_INTERVAL, "exactly-once"),
        // Same input, different output: still another job.
        wordcount_args(&input_x, &output_b, &state, 2, CHECKPOINT_INTERVAL, "exactly-once"),
    ]
    .iter()
    .enumerate()
    {
        let log = scratch.path(&format!("run-b{i}"));
        let fin_b = run_until(&ctx, args_b, &log, deadline);
        assert_refused(&ctx, args_b, &log, &fin_b, &["state directory", &state.display().to_string()]);
        let state_after = snapshot(&state);
        if state_after != state_before {
            ctx.fail(format!(
                "the refused job changed the state directory of job A:\n{}",
                snapshot_diff(&state_before, &state_after)
            ));
        }
        if !committed_parts(&output_b).is_empty() {
            ctx.fail(format!("the refused job committed output into {}", output_b.display()));
        }
        let output_a_after = snapshot(&output_a);
        if output_a_after != output_a_before {
            ctx.fail(format!(
                "the refused job changed job A's output:\n{}",
                snapshot_diff(&output_a_before, &output_a_after)
            ));
        }
    }
}

#[test]
fn a_nexmark_job_refuses_an_unknown_query_and_another_jobs_state() {
    let ctx = Ctx { test: "a_nexmark_job_refuses_an_unknown_query_and_another_jobs_state", seed: seed_for(8) };
    let scratch = Scratch::new(&format!("kill9-{}", ctx.test));
    let (output, state) = (scratch.path("output"), scratch.path("state"));
    let deadline = Instant::now() + SHORT_RUN_TIME_LIMIT;
    let args = nexmark_args(("q9", 1_000, 0), &output, &state, 1, "200ms", "exactly-once");
    let log = scratch.path("run-q9");
    let fin = run_until(&ctx, &args, &log, deadline);
    assert_refused(&ctx, &args, &log, &fin, &["q9", "not implemented"]);

    // A finished q2 job, then q5 on its state directory: refused, naming both.
    let args = nexmark_args(("q2", 10_000, 0), &output, &state, 1, "200ms", "exactly-once");
    let fin = run_until(&ctx, &args, &scratch.path("run-q2"), deadline);
    if !fin.status.success() {
        ctx.fail(format!("the q2 run failed\n{}", describe_run(&args, Some(fin.status), &scratch.path("run-q2"))));
    }
    let args = nexmark_args(("q5", 10_000, 0), &output, &state, 1, "200ms", "exactly-once");
    let log = scratch.path("run-q5");
    let fin = run_until(&ctx, &args, &log, deadline);
    assert_refused(&ctx, &args, &log, &fin, &["belongs to job", "query=q2", "query=q5"]);
}
