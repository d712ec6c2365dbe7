//! Waiting for the other side's next message without paying a sleeping CPU's wake-up.
//! A thread blocked on its socket lets its CPU go idle; on the VMs this project runs on an
//! idle vCPU is halted and the message that wakes it costs a trip through the host — a
//! socket round trip measured 14 µs with nobody idle and 118 µs with both sides idle for
//! 1.4 ms (docs/benchmarks.md, session 22). So each side, where the next message is due
//! soon, watches its socket for a bounded while before blocking: the parent from shortly
//! before its run's expected end (it sleeps with a timer until then, a wake-up paid while
//! the worker still computes), the worker after each reply for about as long as requests
//! have lately been apart, within the budget ([`RequestWatch`]). Past the watch both block
//! as before, so a sparse client or a long run costs no spinning beyond the budget.

use std::io::BufReader;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Whether `socket` has a message (or an end) to read now, without blocking.
fn readable_now(socket: &UnixStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into a live local buffer on a descriptor this side owns;
    // MSG_PEEK leaves the byte in the socket and MSG_DONTWAIT never blocks.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    // 0: the other side closed; an error other than "nothing yet" (a reset): either way
    // the blocking read that follows returns at once with what there is to know.
    n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

/// Blocks until `socket` is readable or `timeout` passes; true when readable.
fn readable_within(socket: &UnixStream, timeout: Duration) -> bool {
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one live pollfd and a live timespec; no signal mask is changed (null).
    unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) > 0 }
}

/// Sets this thread's timer slack to 1 µs, once, and leaves it so (every later timer of
/// the thread — a pool thread of xpud's — gets it too): the default 50 µs would let the
/// sleep before a run's expected end overshoot the window.
fn precise_timers() {
    thread_local! { static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) }; }
    SET.with(|set| {
        if !set.get() {
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
            set.set(true);
        }
    });
}

/// How long before a reply's expected time the parent starts watching for it (after
/// sleeping on a timer until then): a timer's wake-up and the run's jitter fit in it.
const EARLY: Duration = Duration::from_micros(100);

/// Waits until `socket` is readable or the watch runs out, without the caller's CPU going
/// idle while it watches: from `expected − EARLY` on (sleeping on a timer before; at once
/// when `expected` is unknown or shorter), for at most `spin`. The caller's blocking read
/// then waits as it always did if nothing came. A zero `spin`, or a message already in
/// `reader`'s buffer, returns at once.
pub(crate) fn spin_for_message(
    reader: &BufReader<UnixStream>,
    spin: Duration,
    expected: Option<Duration>,
) {
    if spin.is_zero() || !reader.buffer().is_empty() {
        return;
    }
    let socket = reader.get_ref();
    if let Some(expected) = expected.filter(|e| *e > EARLY) {
        precise_timers();
        if readable_within(socket, expected - EARLY) {
            return;
        }
    }
    let until = Instant::now() + spin;
    loop {
        if readable_now(socket) || Instant::now() >= until {
            return;
        }
        // Yield rather than spin in place: the scheduler tends to wake the other side on
        // this CPU (the waker's), and a thread spinning there would keep it from running.
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// When an executable's next reply is due: the shortest of its last few answers. The last
/// answer alone let one slow run (this VM's jitter is ±10% of a millisecond-long run) put
/// the next watch after its reply had already come, so the parent slept through it and paid
/// the wake-up; from the shortest, the watch starts before the reply and a slower run is
/// covered by the watch's budget.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecentAnswers {
    times: [Duration; RecentAnswers::KEPT],
    len: usize,
    next: usize,
}

impl RecentAnswers {
    const KEPT: usize = 8;

    pub(crate) fn record(&mut self, answer: Duration) {
        self.times[self.next] = answer;
        self.next = (self.next + 1) % Self::KEPT;
        self.len = (self.len + 1).min(Self::KEPT);
    }

    /// The shortest recent answer; `None` before the first.
    pub(crate) fn expected(&self) -> Option<Duration> {
        self.times[..self.len].iter().min().copied()
    }
}

/// The worker's watch for its next request, adapted to how far apart requests come: a
/// client sending them back to back (gaps within the budget) finds the worker watching,
/// a sparse one costs no spinning at all (a gap past the budget turns the watch off until
/// gaps shrink again; they are measured either way).
pub(crate) struct RequestWatch {
    budget: Duration,
    last_gap: Option<Duration>,
}

impl RequestWatch {
    pub(crate) fn new(budget: Duration) -> RequestWatch {
        RequestWatch { budget, last_gap: None }
    }

    /// How long to watch before the next request: the last gap and a quarter, within the
    /// budget; nothing after a gap past it.
    pub(crate) fn watch(&self) -> Duration {
        match self.last_gap {
            None => self.budget,
            Some(gap) if gap <= self.budget => (gap + gap / 4).min(self.budget),
            Some(_) => Duration::ZERO,
        }
    }

    /// The time from the last reply to this request.
    pub(crate) fn arrived(&mut self, gap: Duration) {
        self.last_gap = Some(gap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_message_ends_the_spin_and_a_silent_socket_only_its_budget() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let rb = BufReader::new(b.try_clone().unwrap());
        // Nothing comes: the wait ends after about the budget.
        let start = Instant::now();
        spin_for_message(&rb, Duration::from_millis(20), None);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(!readable_now(&b));
        // A message sent meanwhile ends it long before the budget.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.write_all(b"x").unwrap();
            a
        });
        let start = Instant::now();
        spin_for_message(&rb, Duration::from_secs(30), Some(Duration::from_secs(60)));
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
        assert!(readable_now(&b), "the byte is still there to read");
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &b, &mut byte).unwrap();
        assert!(!readable_now(&b));
        // The other side closing ends it too.
        drop(writer.join().unwrap());
        let start = Instant::now();
        spin_for_message(&rb, Duration::from_secs(30), None);
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
        // A zero budget never waits.
        let (_c, d) = UnixStream::pair().unwrap();
        let rd = BufReader::new(d);
        let start = Instant::now();
        spin_for_message(&rd, Duration::ZERO, Some(Duration::from_secs(60)));
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_reply_is_expected_after_the_shortest_recent_answer() {
        let us = Duration::from_micros;
        let mut a = RecentAnswers::default();
        assert_eq!(a.expected(), None, "nothing known before the first answer");
        a.record(us(1300));
        assert_eq!(a.expected(), Some(us(1300)));
        // One slow run does not push the next watch past a usual reply.
        a.record(us(1900));
        assert_eq!(a.expected(), Some(us(1300)));
        // The shortest of the last eight only: an old fast run is forgotten.
        a.record(us(1200));
        for _ in 0..8 {
            a.record(us(1400));
        }
        assert_eq!(a.expected(), Some(us(1400)));
        a.record(us(700));
        assert_eq!(a.expected(), Some(us(700)), "a faster run counts at once");
    }

    #[test]
    fn the_request_watch_follows_the_gaps_and_stops_for_sparse_requests() {
        let ms = Duration::from_millis;
        let mut w = RequestWatch::new(ms(2));
        assert_eq!(w.watch(), ms(2), "the whole budget before any gap is known");
        w.arrived(Duration::from_micros(800));
        assert_eq!(w.watch(), Duration::from_micros(1000), "the gap and a quarter");
        w.arrived(Duration::from_micros(1900));
        assert_eq!(w.watch(), ms(2), "within the budget");
        w.arrived(ms(50));
        assert_eq!(w.watch(), Duration::ZERO, "a sparse client: no spinning");
        w.arrived(Duration::from_micros(100));
        assert_eq!(w.watch(), Duration::from_micros(125), "back to back again");
        assert_eq!(RequestWatch::new(Duration::ZERO).watch(), Duration::ZERO);
    }
}
