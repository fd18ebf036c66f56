//! `delivery-floor`: what one fan-out delivery's system calls cost on this
//! machine, with nothing of ours around them (issue 17's floor).
//!
//! ```text
//! delivery-floor [N] [ROUNDS] [DIR]    # N journals and sockets (1000), ROUNDS rounds (200), files in DIR (a temporary directory)
//! ```
//!
//! It opens N files in DIR and N loopback TCP connections whose other ends
//! a second thread reads (as a subscriber would, with `epoll`), then times,
//! in CPU time per call over N x ROUNDS calls, each system call a delivery
//! into a journal of its own makes in `serve` today:
//!
//! * `pwrite` of a 300-byte record at a file's end (the append itself),
//! * `pwrite` of a 128-byte head at a file's start,
//! * `flock` exclusive and unlock (a pair),
//! * `pread` of the 128-byte head,
//! * `statx` (`fstat`) of an open file,
//! * `write` of a 330-byte SSE frame to a socket: the sender's CPU (on
//!   loopback it also runs the receiving side's TCP work) and, apart, the
//!   reading thread's per frame.
//!
//! and prints them with their sum, the floor of a delivery made as today
//! (every journal a file set of its own, appended under its lock), beside
//! the same without the lock and head (a record write and a socket write).
//! Not a test; `bench/vs-nchan` prints Nchan's CPU per delivery to compare.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// CPU time (user + system) of the calling thread, in microseconds.
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writing the calling thread's CPU clock into our own timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// Runs `op` on every file `rounds` times; CPU microseconds per call.
fn per_call(files: &[File], rounds: usize, mut op: impl FnMut(usize, &File)) -> f64 {
    let start = thread_cpu_us();
    for _ in 0..rounds {
        for (i, f) in files.iter().enumerate() {
            op(i, f);
        }
    }
    (thread_cpu_us() - start) / (files.len() * rounds) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200);
    let dir = match args.get(3) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("delivery-floor-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).expect("cannot create the directory");
    let files: Vec<File> = (0..n)
        .map(|i| OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.join(format!("j{i}"))).expect("cannot open a file"))
        .collect();
    let record = [b'r'; 300];
    let head = [b'h'; 128];

    let mut ends = vec![0u64; n];
    let append = per_call(&files, rounds, |i, f| {
        f.write_at(&record, ends[i]).expect("pwrite");
        ends[i] += record.len() as u64;
    });
    let head_write = per_call(&files, rounds, |_, f| {
        f.write_at(&head, 0).expect("pwrite");
    });
    let lock_pair = per_call(&files, rounds, |_, f| {
        // SAFETY: flock on our own open descriptor.
        unsafe {
            libc::flock(f.as_raw_fd(), libc::LOCK_EX);
            libc::flock(f.as_raw_fd(), libc::LOCK_UN);
        }
    });
    let head_read = per_call(&files, rounds, |_, f| {
        let mut buf = [0u8; 128];
        f.read_exact_at(&mut buf, 0).expect("pread");
    });
    let stat = per_call(&files, rounds, |_, f| {
        std::hint::black_box(f.metadata().expect("statx").len());
    });

    // Sockets: N loopback connections, their far ends read by one thread.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let mut senders = Vec::with_capacity(n);
    let mut receivers = Vec::with_capacity(n);
    for _ in 0..n {
        senders.push(TcpStream::connect(addr).expect("connect"));
        receivers.push(listener.accept().expect("accept").0);
    }
    for s in &senders {
        s.set_nodelay(true).ok();
    }
    let frame = [b'd'; 330];
    let total = (n * rounds * frame.len()) as u64;
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        std::thread::spawn(move || {
            // SAFETY: an epoll instance of our own, over our own sockets.
            let ep = unsafe { libc::epoll_create1(0) };
            for (i, r) in receivers.iter().enumerate() {
                r.set_nonblocking(true).ok();
                let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: i as u64 };
                // SAFETY: registering our own descriptor.
                unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, r.as_raw_fd(), &mut ev) };
            }
            let start = thread_cpu_us();
            let mut got = 0u64;
            let mut reads = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
            while got < total && !done.load(Ordering::Relaxed) {
                // SAFETY: waiting on our own epoll instance into our own buffer.
                let k = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, 100) };
                for ev in events.iter().take(k.max(0) as usize) {
                    let mut r = &receivers[ev.u64 as usize];
                    while let Ok(m) = r.read(&mut buf) {
                        if m == 0 {
                            break;
                        }
                        got += m as u64;
                        reads += 1;
                    }
                }
            }
            (thread_cpu_us() - start, got, reads)
        })
    };
    let start = thread_cpu_us();
    for _ in 0..rounds {
        for s in &senders {
            (&*s).write_all(&frame).expect("write");
        }
    }
    let socket_write = (thread_cpu_us() - start) / (n * rounds) as f64;
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    let (reader_us, got, reads) = reader.join().expect("reader");
    let frames = got as f64 / frame.len() as f64;
    let socket_read = reader_us / frames.max(1.0);
    let _ = std::fs::remove_dir_all(&dir);

    println!("delivery-floor: {n} journals and sockets x {rounds} rounds, CPU microseconds per call");
    println!("| call | µs |");
    println!("|---|---|");
    println!("| pwrite 300-byte record at the end | {append:.2} |");
    println!("| pwrite 128-byte head at the start | {head_write:.2} |");
    println!("| flock exclusive + unlock | {lock_pair:.2} |");
    println!("| pread 128-byte head | {head_read:.2} |");
    println!("| statx of an open file | {stat:.2} |");
    println!("| write 330-byte frame to a loopback socket (sender) | {socket_write:.2} |");
    println!("| its reading, per frame ({reads} reads for {frames:.0} frames) | {socket_read:.2} |");
    let today = append + head_write + lock_pair + head_read + 2.0 * stat + socket_write + stat;
    let bare = append + socket_write;
    println!("floor of a delivery as serve makes it (lock, head read and write, record, 2 statx, socket write, tunnel's statx): {today:.2} µs");
    println!("floor of a record write and a socket write alone: {bare:.2} µs");
}
