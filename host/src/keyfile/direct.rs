//! A key file written around the page cache (`O_DIRECT`).
//!
//! Writing a key file through the page cache costs the dealer's CPU twice:
//! the kernel copies every byte into a cache page (`copy_folio_from_iter`,
//! 52 % of BERT-base's dealer samples) and first zeroes each new page (9 %).
//! With `O_DIRECT` the device reads the bytes from our buffer instead
//! (docs/BACKENDS.md, twenty-third session). Direct writes must start at,
//! and span, whole blocks of [`ALIGN`] bytes from an aligned buffer, so
//! the bytes gather in one buffer of [`CHUNK`] bytes and go out a chunk
//! at a time; the file's last partial block goes through the ordinary
//! handle the file was created with, which then syncs the whole file.
//!
//! Chunks go to the disk from a thread of its own, [`DEPTH`] at most on
//! their way, while the next one gathers in another buffer, so the
//! writer's hashing and copying overlap the device (BERT-base at 128
//! tokens: the P1 writer's copy, hash, wipe and blocking writes in one
//! thread had set the dealer's pace, 13.3 s against 11.0 s online;
//! docs/BACKENDS.md, twenty-sixth session).
//!
//! Each buffer is carved out of a plain `Vec` at an aligned offset (no
//! custom allocation) and wiped when the writer is dropped: it holds key
//! bytes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use zeroize::Zeroize;

/// Block size direct writes are aligned to (every Linux file system's
/// logical block divides it).
const ALIGN: usize = 4096;

/// Bytes gathered before a direct write.
const CHUNK: usize = 8 << 20;

/// A buffer of [`CHUNK`] bytes starting at an aligned address.
struct Aligned {
    raw: Vec<u8>,
    /// Where the aligned part starts in `raw`.
    start: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let raw = vec![0u8; CHUNK + ALIGN];
        let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        Aligned { raw, start }
    }

    fn bytes(&self, n: usize) -> &[u8] {
        &self.raw[self.start..self.start + n]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + CHUNK]
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        self.raw.zeroize();
    }
}

/// A chunk to write: the buffer, its first `n` bytes, at this offset.
type Job = (Aligned, usize, u64);

/// Chunks handed to the write thread and not yet taken back: with two, the
/// thread starts the next write as soon as one ends, instead of waiting
/// for the writer to wake and hand it over (on a busy machine that wake
/// left the device idle: BERT-base's dealer wrote 1.15 GB/s where two
/// direct writers of 8 MiB blocks reach 1.37, forty-fifth session).
const DEPTH: usize = 2;

/// The thread that writes chunks directly, in order, and hands each buffer
/// back with the outcome.
struct Device {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<(Aligned, io::Result<()>)>,
    thread: Option<JoinHandle<()>>,
    /// Chunks on their way whose buffers are not yet back.
    out: usize,
}

impl Device {
    fn start(direct: File) -> io::Result<Device> {
        let (jobs, queue) = sync_channel::<Job>(DEPTH);
        let (back, done) = sync_channel(DEPTH);
        let thread = std::thread::Builder::new()
            .name("key-file-write".into())
            .spawn(move || {
                for (buf, n, at) in queue {
                    let wrote = direct.write_all_at(buf.bytes(n), at);
                    if back.send((buf, wrote)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Device {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            out: 0,
        })
    }

    /// Waits for the oldest chunk on its way, if any: its buffer, or its
    /// error.
    fn wait(&mut self) -> io::Result<Option<Aligned>> {
        if self.out == 0 {
            return Ok(None);
        }
        self.out -= 1;
        let (buf, wrote) = self.done.recv().map_err(|_| stopped())?;
        wrote.map(|()| Some(buf))
    }

    /// Waits for every chunk on its way; the first error, if any, once all
    /// are back (so every buffer is taken back, and wiped, either way).
    fn drain(&mut self) -> io::Result<Vec<Aligned>> {
        let mut back = Vec::with_capacity(self.out);
        let mut first = Ok(());
        while self.out > 0 {
            match self.wait() {
                Ok(b) => back.extend(b),
                Err(e) => first = first.and(Err(e)),
            }
        }
        first.map(|()| back)
    }

    fn send(&mut self, job: Job) -> io::Result<()> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())?;
        self.out += 1;
        Ok(())
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Hang up, take back (and so wipe) the buffers still on their way,
        // and let the thread end.
        self.jobs = None;
        let _ = self.drain();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("the key file's write thread stopped")
}

/// The writer: the direct handle (the thread writes through a clone of
/// it), the handle the file was created with, the buffer being gathered,
/// spares, and the thread writing the chunks on their way (at most
/// [`DEPTH`], so at most `DEPTH + 1` buffers).
pub(super) struct DirectOut {
    direct: File,
    plain: File,
    buf: Aligned,
    /// Buffers back from the thread, not yet gathering again.
    spares: Vec<Aligned>,
    /// Bytes gathered.
    len: usize,
    /// The file offset of the buffer's first byte.
    at: u64,
    device: Device,
}

impl DirectOut {
    /// Opens `path` (just created, empty, as `plain`) a second time for
    /// direct writes; gives `plain` back when the file system refuses
    /// `O_DIRECT` (tmpfs, some network file systems), or no thread can be
    /// started, and the caller writes through the page cache.
    pub(super) fn open(path: &Path, plain: File) -> Result<DirectOut, File> {
        let Ok(flags) = i32::try_from(rustix::fs::OFlags::DIRECT.bits()) else {
            return Err(plain);
        };
        let Ok(direct) = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(path)
        else {
            return Err(plain);
        };
        let Ok(device) = direct.try_clone().and_then(Device::start) else {
            return Err(plain);
        };
        Ok(DirectOut {
            direct,
            plain,
            buf: Aligned::new(),
            spares: Vec::new(),
            len: 0,
            at: 0,
            device,
        })
    }

    /// Appends `bytes`, handing each chunk to the write thread as it fills.
    pub(super) fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = (CHUNK - self.len).min(bytes.len());
            let len = self.len;
            self.buf.bytes_mut()[len..len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            if self.len == CHUNK {
                self.hand_off()?;
            }
        }
        Ok(())
    }

    /// Sends the full buffer to the thread and goes on in another one (a
    /// spare, else one back from the oldest chunk once [`DEPTH`] are on
    /// their way, else a new one).
    fn hand_off(&mut self) -> io::Result<()> {
        if self.spares.is_empty() && self.device.out >= DEPTH {
            self.spares.extend(self.device.wait()?);
        }
        let next = self.spares.pop().unwrap_or_else(Aligned::new);
        let full = std::mem::replace(&mut self.buf, next);
        self.device.send((full, CHUNK, self.at))?;
        self.at += CHUNK as u64;
        self.len = 0;
        Ok(())
    }

    /// Waits for the chunks on their way, writes what is left (whole
    /// blocks directly, the last partial block through the plain handle)
    /// and syncs the file.
    pub(super) fn finish(&mut self) -> io::Result<()> {
        let back = self.device.drain()?;
        self.spares.extend(back);
        let whole = self.len - self.len % ALIGN;
        let left = self.buf.bytes(self.len);
        self.direct.write_all_at(&left[..whole], self.at)?;
        self.plain
            .write_all_at(&left[whole..], self.at + whole as u64)?;
        self.at += self.len as u64;
        self.len = 0;
        self.plain.sync_all()
    }
}
