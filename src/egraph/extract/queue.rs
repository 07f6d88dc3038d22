//! Complete programs are rebuilt, checked and lowered on a second thread (`LoweringQueue`),
//! which decides and counts exactly as checking each in turn would.

use super::extract_graph::ExtractGraph;
use super::output::{reconstruct, summarize};
use super::validity::no_dead_components;
use super::{Candidate, Choice, Scorer};
use crate::ir::Function;
use rustc_hash::{FxHashMap, FxHashSet};

/// What the complete programs of a run came to.
#[derive(Default)]
pub(super) struct Outcomes {
    /// The ≈ classes output.
    pub(super) distinct: FxHashSet<Vec<u32>>,
    pub(super) candidates: Vec<Candidate>,
    pub(super) complete: usize,
    pub(super) not_lowerable: usize,
    pub(super) first_refusal: Option<String>,
    /// Counts decided by a verdict of the lowering queue.
    pub(super) deferred: Deferred,
    /// Fingerprints (up to axis renaming, `ir::alpha`) of the programs output.
    pub(super) fingerprints: FxHashSet<u128>,
    /// Complete programs not output as they rename the axes of one that was.
    pub(super) renamed: usize,
    /// Rank-bounded extraction: how many best estimates to keep, and those found (as f64
    /// bits, which order as the non-negative numbers do; the largest on top).
    pub(super) top: usize,
    pub(super) best: std::collections::BinaryHeap<u64>,
    /// How often an estimate entered the best `top`.
    pub(super) improvements: usize,
}

impl Outcomes {
    /// A complete program the backend lowers (or one of a class already output, which needs no
    /// lowering): counted, and output when its class is new or every program is. True when it
    /// was output.
    pub(super) fn accept(
        &mut self,
        class_form: Vec<u32>,
        choice: &Choice,
        cost: u64,
        every: bool,
        fingerprint: u128,
    ) -> bool {
        self.complete += 1;
        let new = self.distinct.insert(class_form);
        if new || every {
            self.candidates.push(Candidate::new(choice, cost));
            self.fingerprints.insert(fingerprint);
        }
        new || every
    }

    /// The best estimate found, and the `top`-th once there are `top` (rank-bounded).
    pub(super) fn best_and_kth(&self) -> (Option<f64>, Option<f64>) {
        let best = self.best.iter().min().map(|b| f64::from_bits(*b));
        let full = self.top > 0 && self.best.len() >= self.top;
        (
            best,
            self.best
                .peek()
                .filter(|_| full)
                .map(|b| f64::from_bits(*b)),
        )
    }

    /// The estimate of the candidate output last (rank-bounded extraction).
    pub(super) fn estimated(&mut self, estimate: Option<f64>) {
        if let Some(c) = self.candidates.last_mut() {
            c.estimate = estimate;
        }
        if let Some(e) = estimate.filter(|_| self.top > 0) {
            let bits = e.max(0.0).to_bits();
            self.best.push(bits);
            let dropped = (self.best.len() > self.top)
                .then(|| self.best.pop())
                .flatten();
            if dropped != Some(bits) {
                self.improvements += 1;
            }
        }
    }

    /// A complete program whose axes rename those of one output: its class counts as output
    /// (so the search prunes it like any other output class) but it is not output again.
    pub(super) fn renaming(&mut self, class_form: Vec<u32>) {
        self.complete += 1;
        self.renamed += 1;
        self.distinct.insert(class_form);
    }

    /// A complete program the backend refuses: its class stays open to another.
    pub(super) fn refused(&mut self, reason: String) {
        self.not_lowerable += 1;
        self.first_refusal.get_or_insert(reason);
    }
}

/// A complete program rebuilt as a function, if it passes the checks besides lowering that
/// need the function: no dead component, a launch order (`summarize`), and at most
/// `max_kernels` kernels.
pub(super) fn rebuilt(
    x: &ExtractGraph,
    choice: &Choice,
    max_kernels: Option<usize>,
) -> Result<Function, Refusal> {
    let mut program = reconstruct(x, choice, "");
    if !no_dead_components(&program, &x.g.egraph.analysis.env) {
        return Err(Refusal::DeadComponent);
    }
    let summary = summarize(&mut program);
    if !summary.launch_order {
        return Err(Refusal::NoLaunchOrderFound);
    }
    if max_kernels.is_some_and(|max| summary.kernels > max) {
        return Err(Refusal::OverKernels);
    }
    Ok(program)
}

/// Why a complete program is refused before lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `launch_order_impossible` on the complete program.
    NoLaunchOrder,
    /// `no_dead_components` on the rebuilt function.
    DeadComponent,
    /// `summarize` found no launch order.
    NoLaunchOrderFound,
    /// More kernels than `max_kernels`.
    OverKernels,
}

/// Counts the lowering queue's verdicts decide: a complete program refused before lowering
/// whose class had a program waiting counts as ≈ an output program if that one is output.
#[derive(Default)]
pub(super) struct Deferred {
    pub(super) equivalent: usize,
    pub(super) refusals: Vec<Refusal>,
}

impl Deferred {
    pub(super) fn count(&self, r: Refusal) -> usize {
        self.refusals.iter().filter(|x| **x == r).count()
    }
}

/// The lowering worker's verdict on a complete program.
pub(super) enum Verdict {
    /// Lowered: its class is output; its fingerprint up to axis renaming, and its estimate
    /// (rank-bounded extraction).
    Lowered(u128, Option<f64>),
    /// Renames the axes of a program output before it: its class counts as output.
    Renamed,
    Refused(String),
    /// Refused by a check before lowering (`rebuilt`).
    Before(Refusal),
    /// Not lowered, as a program of its class was output before it (true), or as it was
    /// refused before it was sent and no program of its class was output (false).
    ClassOutput(bool),
}

/// Rebuilds a complete program as a function and checks it (`rebuilt`).
pub(super) type Rebuild<'scope> = Box<dyn Fn(&Choice) -> Result<Function, Refusal> + Send + 'scope>;

/// Complete programs waiting to be rebuilt, checked and lowered by a worker thread while the
/// search goes on (on MHA decode these took half the search's time). The worker takes them in
/// submission order and keeps the classes output, so it decides, as checking each program in
/// turn would, whether a program's class was output by an earlier one (early compaction
/// prunes such a program before its checks; `after` counts it once it passes them, without
/// lowering it). The verdicts are recorded in submission order too, so what a run outputs and
/// counts does not depend on the worker's timing, and the candidate limit is decided by
/// draining every verdict once the waiting programs could reach it.
pub(super) struct LoweringQueue<'scope> {
    pub(super) jobs: Option<std::sync::mpsc::Sender<(Vec<u32>, Option<Choice>)>>,
    pub(super) verdicts: std::sync::mpsc::Receiver<Verdict>,
    pub(super) worker: Option<std::thread::ScopedJoinHandle<'scope, ()>>,
    /// Each waiting program's class, choice, cost and refusal before it was sent, in
    /// submission order.
    pub(super) waiting: std::collections::VecDeque<(Vec<u32>, Choice, u64, Option<Refusal>)>,
    /// How many programs of each class wait.
    pub(super) classes: FxHashMap<Vec<u32>, usize>,
    pub(super) early: bool,
    /// The search step (programs taken) at which each waiting program was sent, and the
    /// step now (`poll_due`).
    pub(super) sent_at: std::collections::VecDeque<usize>,
    pub(super) now: usize,
}

/// Waiting programs past this many hold the search until the worker catches up: each holds
/// two choices.
pub(super) const MAX_WAITING: usize = 256;

/// `poll_due`: a verdict is recorded once this many programs were taken after its program
/// was sent, or once more than `DUE_WAITING` programs wait.
pub(super) const DUE_STEPS: usize = 1024;
pub(super) const DUE_WAITING: usize = 64;

impl<'scope> LoweringQueue<'scope> {
    pub(super) fn new<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        check: Scorer,
        rebuild: impl Fn(&Choice) -> Result<Function, Refusal> + Send + 'scope,
        early: bool,
    ) -> LoweringQueue<'scope> {
        let rebuild: Rebuild<'scope> = Box::new(rebuild);
        let (jobs, inbox) = std::sync::mpsc::channel::<(Vec<u32>, Option<Choice>)>();
        let (outbox, verdicts) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .stack_size(crate::THREAD_STACK)
            .spawn_scoped(scope, move || {
                let mut output: FxHashSet<Vec<u32>> = FxHashSet::default();
                let mut fingerprints: FxHashSet<u128> = FxHashSet::default();
                for (class_form, choice) in inbox {
                    let verdict = match choice {
                        _ if early && output.contains(&class_form) => Verdict::ClassOutput(true),
                        None => Verdict::ClassOutput(false),
                        Some(choice) => match rebuild(&choice) {
                            Err(refusal) => Verdict::Before(refusal),
                            Ok(_) if output.contains(&class_form) => Verdict::ClassOutput(true),
                            Ok(f) => {
                                let fingerprint = crate::ir::alpha::fingerprint(&f);
                                if early && fingerprints.contains(&fingerprint) {
                                    output.insert(class_form);
                                    Verdict::Renamed
                                } else {
                                    match check(&f) {
                                        Ok(estimate) => {
                                            output.insert(class_form);
                                            fingerprints.insert(fingerprint);
                                            Verdict::Lowered(fingerprint, estimate)
                                        }
                                        Err(reason) => Verdict::Refused(reason),
                                    }
                                }
                            }
                        },
                    };
                    if outbox.send(verdict).is_err() {
                        break;
                    }
                }
            })
            // As `scope.spawn`, which panics where the OS starts no thread.
            .expect("the OS starts the lowering worker thread");
        LoweringQueue {
            jobs: Some(jobs),
            verdicts,
            worker: Some(worker),
            waiting: Default::default(),
            classes: Default::default(),
            early,
            sent_at: Default::default(),
            now: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    pub(super) fn waits_for(&self, class_form: &[u32]) -> bool {
        self.classes.contains_key(class_form)
    }

    /// Sends a complete program (its choice) to be rebuilt, checked and lowered, or (`None`,
    /// with its refusal) one refused before it was sent whose count depends on the verdict of
    /// a program of its class that waits.
    pub(super) fn submit(
        &mut self,
        program: Option<Choice>,
        class_form: Vec<u32>,
        choice: Choice,
        cost: u64,
        refusal: Option<Refusal>,
    ) {
        if let Some(jobs) = &self.jobs {
            if jobs.send((class_form.clone(), program)).is_ok() {
                *self.classes.entry(class_form.clone()).or_default() += 1;
                self.waiting.push_back((class_form, choice, cost, refusal));
                self.sent_at.push_back(self.now);
                return;
            }
        }
        self.worker_died();
    }

    /// Records the oldest waiting program's verdict; `wait` blocks for it.
    pub(super) fn receive(&mut self, out: &mut Outcomes, wait: bool) -> bool {
        if self.waiting.is_empty() {
            return false;
        }
        let verdict = if wait {
            match self.verdicts.recv() {
                Ok(v) => v,
                Err(_) => self.worker_died(),
            }
        } else {
            match self.verdicts.try_recv() {
                Ok(v) => v,
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => self.worker_died(),
            }
        };
        let Some((class_form, choice, cost, refusal)) = self.waiting.pop_front() else {
            return false;
        };
        self.sent_at.pop_front();
        if let Some(n) = self.classes.get_mut(&class_form) {
            *n -= 1;
            if *n == 0 {
                self.classes.remove(&class_form);
            }
        }
        match (verdict, refusal) {
            (Verdict::Lowered(fingerprint, estimate), _) => {
                if out.accept(class_form, &choice, cost, false, fingerprint) {
                    out.estimated(estimate);
                }
            }
            (Verdict::Renamed, _) => out.renaming(class_form),
            (Verdict::Refused(reason), _) => out.refused(reason),
            (Verdict::Before(r), _) | (Verdict::ClassOutput(false), Some(r)) => {
                out.deferred.refusals.push(r)
            }
            (Verdict::ClassOutput(true), _) if self.early => out.deferred.equivalent += 1,
            (Verdict::ClassOutput(true), _) => out.complete += 1,
            (Verdict::ClassOutput(false), None) => {}
        }
        true
    }

    /// Records the verdicts that are in.
    pub(super) fn poll(&mut self, out: &mut Outcomes) {
        while self.receive(out, false) {}
    }

    /// Records the verdicts due at search step `now` (`DUE_STEPS`, `DUE_WAITING`), waiting
    /// for them, and no other: which verdicts the search has seen at each step does not
    /// depend on the worker's timing. Rank-bounded extraction prunes by the estimates
    /// recorded, so with `poll` its output would.
    pub(super) fn poll_due(&mut self, out: &mut Outcomes, now: usize) {
        self.now = now;
        while let Some(&sent) = self.sent_at.front() {
            let due = self.waiting.len() > DUE_WAITING || now.saturating_sub(sent) >= DUE_STEPS;
            if !due || !self.receive(out, true) {
                break;
            }
        }
    }

    /// Waits until few enough programs wait.
    pub(super) fn bound(&mut self, out: &mut Outcomes) {
        while self.waiting.len() > MAX_WAITING && self.receive(out, true) {}
    }

    /// Waits for every verdict.
    pub(super) fn drain(&mut self, out: &mut Outcomes) {
        while self.receive(out, true) {}
    }

    /// The worker ended without a verdict: only a panic in rebuilding or in the backend's
    /// check does that, and it is raised here as it would have been on this thread.
    pub(super) fn worker_died(&mut self) -> ! {
        self.jobs = None;
        if let Some(Err(panic)) = self.worker.take().map(|w| w.join()) {
            std::panic::resume_unwind(panic);
        }
        unreachable!("the lowering worker ended without a panic while programs waited")
    }
}

impl Drop for LoweringQueue<'_> {
    fn drop(&mut self) {
        // Closing the job channel ends the worker's loop.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Choice, Function, LoweringQueue, Outcomes, Refusal};

    /// A one-statement function named `name`, for a stand-in backend to judge by name; its
    /// body differs with `variant` (distinct programs of distinct classes).
    fn named_function(name: &str, variant: u32) -> Function {
        let src = format!(
            "func f where N = 4 {{\n  x: tensor<N, f32> = input\n  return exp(x) * {variant}.0\n}}\n"
        );
        let mut m = crate::parse::parse_module(&src, 0).expect("parses");
        crate::verify::verify_module(&mut m).expect("verifies");
        let mut f = m.funcs.remove(0);
        f.name = name.to_string();
        f
    }

    /// An estimate improves the best `top` when it enters them: while fewer than `top` are
    /// held, or when it is below the `top`-th (a tie with the `top`-th changes nothing).
    #[test]
    fn improvements_count_estimates_entering_the_best_top() {
        let mut out = Outcomes {
            top: 2,
            ..Outcomes::default()
        };
        let mut seen = Vec::new();
        for e in [5.0, 3.0, 7.0, 5.0, 4.0, 9.0, 3.0] {
            out.estimated(Some(e));
            seen.push(out.improvements);
        }
        // 5 and 3 fill the top; 7 and a tie at 5 do not enter; 4 does; 9 does not; 3 does.
        assert_eq!(seen, [1, 2, 2, 2, 3, 3, 4]);
        assert_eq!(out.best_and_kth(), (Some(3.0), Some(3.0)));
        let mut one = Outcomes {
            top: 3,
            ..Outcomes::default()
        };
        one.estimated(Some(2.5));
        assert_eq!(one.best_and_kth(), (Some(2.5), None));
    }

    /// Stand-in programs for the queue, by their choice's first entry.
    const LOWERS: u32 = 0;
    const REFUSED: u32 = 1;
    const DEAD_COMPONENT: u32 = 2;

    /// The queue with a stand-in backend that lowers the functions named `lowers`, counting
    /// its calls, and a stand-in rebuild that refuses `DEAD_COMPONENT` programs.
    fn stand_in_queue<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        calls: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        early: bool,
    ) -> LoweringQueue<'scope> {
        let calls = calls.clone();
        let check: super::Scorer = std::sync::Arc::new(move |f: &Function| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match f.name.as_str() {
                "lowers" => Ok(None),
                _ => Err("refused".to_string()),
            }
        });
        // The choice's second entry, when there is one, tells distinct programs apart.
        let rebuild = |choice: &Choice| {
            let variant = choice.get(1).copied().unwrap_or(0);
            match choice[0] {
                LOWERS => Ok(named_function("lowers", variant)),
                REFUSED => Ok(named_function("refused", variant)),
                _ => Err(Refusal::DeadComponent),
            }
        };
        LoweringQueue::new(scope, check, rebuild, early)
    }

    /// Early compaction: a program refused before it was sent while a program of its class
    /// waits counts as ≈ an output program when that one is lowered, and as its own refusal
    /// when that one is refused — as checking them in turn would count it.
    #[test]
    fn a_refusal_while_its_class_waits_is_counted_by_that_class_verdict() {
        for (first, output) in [(LOWERS, 1), (REFUSED, 0)] {
            let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let out = std::thread::scope(|scope| {
                let mut queue = stand_in_queue(scope, &calls, true);
                let mut out = Outcomes::default();
                let class = vec![7u32, 1];
                queue.submit(Some(vec![first]), class.clone(), vec![first], 5, None);
                assert!(queue.waits_for(&class));
                let refusal = Some(Refusal::NoLaunchOrder);
                queue.submit(None, class.clone(), Choice::new(), 6, refusal);
                queue.drain(&mut out);
                assert!(!queue.waits_for(&class) && queue.len() == 0);
                out
            });
            assert_eq!(out.candidates.len(), output);
            assert_eq!(out.deferred.equivalent, output);
            assert_eq!(out.deferred.count(Refusal::NoLaunchOrder), 1 - output);
            assert_eq!(out.not_lowerable, 1 - output);
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }

    /// A program whose class an earlier waiting program output is not lowered: early
    /// compaction counts it as ≈ that one without checking it, `after` checks it and counts
    /// it as a complete program; a refused program leaves its class open, so the next one of
    /// the class is lowered and output.
    #[test]
    fn the_queue_lowers_one_program_per_output_class_in_submission_order() {
        for early in [true, false] {
            let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let out = std::thread::scope(|scope| {
                let mut queue = stand_in_queue(scope, &calls, early);
                let mut out = Outcomes::default();
                let (a, b) = (vec![1u32], vec![2u32]);
                for (program, class, cost) in [
                    (REFUSED, &a, 1),
                    (DEAD_COMPONENT, &a, 2),
                    (LOWERS, &a, 3),
                    (LOWERS, &a, 4),
                    (DEAD_COMPONENT, &a, 5),
                    (LOWERS, &b, 6),
                ] {
                    let choice = vec![program, class[0]];
                    queue.submit(Some(choice.clone()), class.clone(), choice, cost, None);
                }
                queue.drain(&mut out);
                out
            });
            let costs: Vec<u64> = out.candidates.iter().map(|c| c.cost).collect();
            assert_eq!(costs, [3, 6]);
            assert_eq!(out.not_lowerable, 1);
            assert_eq!(out.first_refusal.as_deref(), Some("refused"));
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
            if early {
                // The fourth and fifth are ≈ the third, whatever their own checks say.
                assert_eq!((out.complete, out.deferred.equivalent), (2, 2));
                assert_eq!(out.deferred.count(Refusal::DeadComponent), 1);
            } else {
                assert_eq!((out.complete, out.deferred.equivalent), (3, 0));
                assert_eq!(out.deferred.count(Refusal::DeadComponent), 2);
            }
        }
    }

    /// Early compaction: a program of a new class that renames the axes of one output (here:
    /// the same function) is not lowered or output again; its class counts as output, so a
    /// later program of that class is ≈ it.
    #[test]
    fn a_renaming_of_an_output_program_is_counted_not_output() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out = std::thread::scope(|scope| {
            let mut queue = stand_in_queue(scope, &calls, true);
            let mut out = Outcomes::default();
            let (a, b, c) = (vec![1u32], vec![2u32], vec![3u32]);
            for (choice, class) in [
                (vec![LOWERS, 0], &a),
                (vec![LOWERS, 0], &b),
                (vec![LOWERS, 0], &b),
                (vec![LOWERS, 5], &c),
            ] {
                queue.submit(Some(choice.clone()), class.clone(), choice, 1, None);
            }
            queue.drain(&mut out);
            out
        });
        assert_eq!(out.candidates.len(), 2);
        assert_eq!(out.renamed, 1);
        assert_eq!(out.deferred.equivalent, 1);
        assert_eq!(out.distinct.len(), 3);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
