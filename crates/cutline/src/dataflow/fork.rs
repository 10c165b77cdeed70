//! Streams with several consumers: [`Stream::tee`] (every record to two branches) and
//! [`Stream::split`] (side outputs: the `Left` records of an `Either` stream to one branch, the
//! `Right` ones to the other, without copying).
//!
//! A fork adds no stage and no channel: the stage that produces the stream ends its chain in a fork
//! element that feeds both branches' chains, each ending in its own output edge or sink. Every
//! control hook (watermarks, barriers, end of input, commits) goes to both branches, first one,
//! then the other; the stage may start work only when both have credit, so the slower branch holds
//! back both (as one consumer would).

use super::api::{Either, Job, Link, Part, Stream, TailFn};
use super::emit::{Emit, Pending};
use crate::error::TaskError;
use crate::state::SnapshotBuilder;
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use cutline_core::CheckpointId;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Makes the fork element from both branches' tails.
type Combine<T, A, B> = fn(Box<dyn Emit<A>>, Box<dyn Emit<B>>) -> Box<dyn Emit<T>>;

/// A fork's branch tails as they are closed (build time).
type Slots<A, B> = RefCell<(Option<TailFn<A>>, Option<TailFn<B>>)>;

impl<T: Send + 'static> Stream<T> {
    /// Two streams with every record of this one, to be consumed by two operators (each branch may
    /// map, key, window or sink on its own). Both branches must be consumed.
    pub fn tee(self) -> (Stream<T>, Stream<T>)
    where
        T: Clone,
    {
        self.fork(|a, b| Box::new(Tee { a, b }))
    }

    /// The branches of a fork: each part's stage closes once both branches are closed, with
    /// `combine` of their tails as its chain's tail.
    fn fork<A: Send + 'static, B: Send + 'static>(self, combine: Combine<T, A, B>) -> (Stream<A>, Stream<B>) {
        let job = self.job.clone();
        let (mut left, mut right) = (Vec::new(), Vec::new());
        for p in self.parts {
            let stage = p.stage;
            let slots: Rc<Slots<A, B>> = Rc::new(RefCell::new((None, None)));
            let part = Rc::new(RefCell::new(Some(p)));
            let finish = {
                let (slots, part) = (slots.clone(), part.clone());
                Rc::new(move |job: &Job| {
                    let (a, b) = match &*slots.borrow() {
                        (Some(a), Some(b)) => (a.clone(), b.clone()),
                        _ => return,
                    };
                    let p = part.borrow_mut().take().expect("a fork closes its stage once");
                    p.close(job, Arc::new(move |ctx| Ok(combine(a(ctx)?, b(ctx)?))));
                })
            };
            let (s, f) = (slots.clone(), finish.clone());
            left.push(Part {
                stage,
                link: Link::Branch(Rc::new(move |job: &Job, tail: TailFn<A>| {
                    assert!(s.borrow_mut().0.replace(tail).is_none(), "a fork's branch closed twice");
                    f(job)
                })),
            });
            right.push(Part {
                stage,
                link: Link::Branch(Rc::new(move |job: &Job, tail: TailFn<B>| {
                    assert!(slots.borrow_mut().1.replace(tail).is_none(), "a fork's branch closed twice");
                    finish(job)
                })),
            });
        }
        (Stream { job: job.clone(), parts: left }, Stream { job, parts: right })
    }
}

impl<A: Send + 'static, B: Send + 'static> Stream<Either<A, B>> {
    /// Side outputs: the `Left` records as one stream and the `Right` ones as another (e.g. a
    /// window's results and its late records from
    /// [`WindowedStream::aggregate_with_late`](super::WindowedStream::aggregate_with_late)). Records
    /// are moved, not copied. Both streams must be consumed.
    pub fn split(self) -> (Stream<A>, Stream<B>) {
        self.fork(|a, b| Box::new(Split { a, b }))
    }
}

/// Every hook but the per-record ones, to both branches in turn.
macro_rules! fork_control {
    () => {
        fn flush(&mut self) -> Result<(), TaskError> {
            self.a.flush()?;
            self.b.flush()
        }
        fn has_credit(&self) -> bool {
            self.a.has_credit() && self.b.has_credit()
        }
        fn on_watermark(&mut self, watermark: WatermarkUpdate) -> Result<(), TaskError> {
            self.a.on_watermark(watermark)?;
            self.b.on_watermark(watermark)
        }
        fn on_tick(&mut self, now_ms: u64) -> Result<Pending, TaskError> {
            Ok(self.a.on_tick(now_ms)?.and(self.b.on_tick(now_ms)?))
        }
        fn on_source_idle(&mut self, idle_ms: u64) -> Result<(), TaskError> {
            self.a.on_source_idle(idle_ms)?;
            self.b.on_source_idle(idle_ms)
        }
        fn on_source_splits(&mut self, splits: &[$crate::connectors::SplitId]) -> Result<(), TaskError> {
            self.a.on_source_splits(splits)?;
            self.b.on_source_splits(splits)
        }
        fn on_barrier(&mut self, barrier: &Barrier, snap: &mut SnapshotBuilder) -> Result<(), TaskError> {
            self.a.on_barrier(barrier, snap)?;
            self.b.on_barrier(barrier, snap)
        }
        fn on_input_end(&mut self) -> Result<(), TaskError> {
            self.a.on_input_end()?;
            self.b.on_input_end()
        }
        fn on_end(&mut self) -> Result<(), TaskError> {
            self.a.on_end()?;
            self.b.on_end()
        }
        fn on_close(&mut self) -> Result<(), TaskError> {
            self.a.on_close()?;
            self.b.on_close()
        }
        fn on_complete(&mut self, checkpoint: CheckpointId) -> Result<(), TaskError> {
            self.a.on_complete(checkpoint)?;
            self.b.on_complete(checkpoint)
        }
        fn on_start(&mut self) -> Result<(), TaskError> {
            self.a.on_start()?;
            self.b.on_start()
        }
        fn on_cancel(&mut self) {
            self.a.on_cancel();
            self.b.on_cancel()
        }
    };
}

/// Every record to both branches.
struct Tee<T> {
    a: Box<dyn Emit<T>>,
    b: Box<dyn Emit<T>>,
}

impl<T: Clone + Send> Emit<T> for Tee<T> {
    fn emit(&mut self, item: T) -> Result<(), TaskError> {
        self.a.emit(item.clone())?;
        self.b.emit(item)
    }
    fn emit_batch(&mut self, batch: Vec<T>) -> Result<(), TaskError> {
        self.a.emit_batch(batch.clone())?;
        self.b.emit_batch(batch)
    }
    fork_control!();
}

/// `Left` records to one branch, `Right` ones to the other.
struct Split<A, B> {
    a: Box<dyn Emit<A>>,
    b: Box<dyn Emit<B>>,
}

impl<A: Send, B: Send> Emit<Either<A, B>> for Split<A, B> {
    fn emit(&mut self, item: Either<A, B>) -> Result<(), TaskError> {
        match item {
            Either::Left(a) => self.a.emit(a),
            Either::Right(b) => self.b.emit(b),
        }
    }
    fn emit_batch(&mut self, batch: Vec<Either<A, B>>) -> Result<(), TaskError> {
        let (mut left, mut right) = (Vec::new(), Vec::new());
        for item in batch {
            match item {
                Either::Left(a) => left.push(a),
                Either::Right(b) => right.push(b),
            }
        }
        if !left.is_empty() {
            self.a.emit_batch(left)?;
        }
        if !right.is_empty() {
            self.b.emit_batch(right)?;
        }
        Ok(())
    }
    fork_control!();
}
