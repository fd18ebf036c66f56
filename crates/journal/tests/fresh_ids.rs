//! Fresh event ids come from a generator per thread (ids.rs): they must
//! stay unique across threads, across reseeds, and across a `fork` of a
//! program embedding the crate, where the child starts with a copy of its
//! parent's generator.

use std::collections::HashSet;

use kn_journal::fresh_id;

#[test]
fn ids_are_unique_across_threads_and_reseeds() {
    // 4 threads x 20,000 ids of 12 bytes: each thread's generator is
    // seeded again after 64 KiB, three times over.
    let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(|| (0..20_000).map(|_| fresh_id()).collect::<Vec<_>>())).collect();
    let mut seen = HashSet::new();
    for t in threads {
        for id in t.join().unwrap() {
            assert_eq!(id.len(), 16, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
            assert!(seen.insert(id.clone()), "id {id} made twice");
        }
    }
    assert_eq!(seen.len(), 80_000);
}

#[test]
fn a_forked_child_never_repeats_its_parents_ids() {
    // Seed this thread's generator before the fork.
    let before = fresh_id();
    let mut fds = [0i32; 2];
    // SAFETY: a pipe of two new descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes ids, writes them to the pipe and
    // leaves with _exit (no destructors, no flushing of the parent's
    // buffers).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ids: String = (0..8).map(|_| fresh_id()).collect();
        // SAFETY: writing our own buffer to the pipe, then leaving.
        unsafe {
            libc::write(fds[1], ids.as_ptr().cast(), ids.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closing the write end the parent does not use.
    unsafe { libc::close(fds[1]) };
    let parent: Vec<String> = (0..8).map(|_| fresh_id()).collect();
    let mut buf = [0u8; 8 * 16];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the rest of our own buffer.
        let n = unsafe { libc::read(fds[0], buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        assert!(n > 0, "the child wrote {got} bytes");
        got += n as usize;
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let child: Vec<String> = buf.chunks(16).map(|c| String::from_utf8(c.to_vec()).unwrap()).collect();
    assert!(!parent.contains(&before) && !child.contains(&before));
    for id in &child {
        assert!(!parent.contains(id), "the child made the parent's id {id}: parent {parent:?}, child {child:?}");
    }
}
