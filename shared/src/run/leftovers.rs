//! What a job leaves running, found and killed by the runner itself between jobs.
//!
//! A provisioner or provider can leave a process behind (`nohup … &`, `setsid`, a daemon). It
//! must never meet the next job: that job's variables, its state server's password and its
//! cloud session would be within its reach. So the runner walks `/proc` after every job and
//! before the next one, and SIGKILLs whatever the finished job could have left:
//! - [`Leftovers::User`]: every process of a uid that only jobs run as (a job's own user, or
//!   the one user `TERRACE_TERRAFORM_USER` gives every job). The runner is root then, so no
//!   process of that user can signal it or stop its killing (a forked killer running as the
//!   user could be stopped by the processes it was sent to kill).
//! - [`Leftovers::Mine`]: terraform runs as the runner's own user. Its descendants are the
//!   job's (the local binary makes itself a child subreaper, so an orphan that detached is
//!   adopted by the runner, not by init, and stays one), and where the runner is the only
//!   program of its uid (a Lambda sandbox) every other process of that uid but the runner's
//!   ancestors.
//!
//! Each round stops every process found (SIGSTOP) and then kills it (SIGKILL), so that one that
//! forks as fast as it can has no child the round does not see. The wait is bounded: what still
//! runs after it is reported as [`Survivors`], and the caller then starts no job.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How long the runner waits for what it killed to be gone.
pub const WAIT: Duration = Duration::from_secs(5);

/// Whose processes count as a finished job's leftovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftovers {
    /// Every process of this uid (never root's).
    User(u32),
    /// The runner's descendants; with `whole_uid`, also every other process of the runner's
    /// uid that is not one of its ancestors (where nothing else of that uid runs).
    Mine { whole_uid: bool },
}

/// Processes that were still alive when the bounded wait ran out.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} process(es) a job left running did not die within {} s (pids {pids:?}): no job starts until they are gone",
    pids.len(),
    within.as_secs()
)]
pub struct Survivors {
    pub pids: Vec<i32>,
    pub within: Duration,
}

/// One process, as `/proc` shows it.
#[derive(Clone, Debug)]
struct Proc {
    pid: i32,
    ppid: i32,
    /// `R`, `S`, `D`, `T`, `Z` (dead, not yet reaped), …
    state: char,
    /// Real, effective, saved and file-system uid.
    uids: [u32; 4],
}

impl Proc {
    fn dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// Reads `/proc/<pid>`; `None` for a process gone meanwhile (or not a process).
    fn read(pid: i32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: the name may hold spaces and parentheses.
        let (_, rest) = stat.rsplit_once(") ")?;
        let mut fields = rest.split(' ');
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        let mut uids = [0; 4];
        let mut parts = line.split_whitespace();
        for uid in &mut uids {
            *uid = parts.next()?.parse().ok()?;
        }
        Some(Self {
            pid,
            ppid,
            state,
            uids,
        })
    }
}

/// Every process on the machine (in this pid namespace).
fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(Proc::read)
        .collect()
}

impl Leftovers {
    /// The processes of `all` this covers, as the runner `me` (with uid `my_uid`) sees them.
    fn select(self, all: &[Proc], me: i32, my_uid: u32) -> Vec<Proc> {
        let parent: BTreeMap<i32, i32> = all.iter().map(|p| (p.pid, p.ppid)).collect();
        // Whether `pid` descends from `from` (a bounded walk: pids can be reused mid-walk).
        let descends = |mut pid: i32, from: i32| {
            for _ in 0..all.len() {
                match parent.get(&pid) {
                    Some(&p) if p == from => return true,
                    Some(&p) if p > 0 && p != pid => pid = p,
                    _ => return false,
                }
            }
            false
        };
        let ancestors: BTreeSet<i32> = {
            let mut up = BTreeSet::new();
            let mut pid = me;
            while let Some(&p) = parent.get(&pid) {
                if p <= 0 || !up.insert(p) {
                    break;
                }
                pid = p;
            }
            up
        };
        all.iter()
            .filter(|p| p.pid != me && p.pid != 1)
            .filter(|p| match self {
                Leftovers::User(uid) => uid != 0 && p.uids[..3].contains(&uid),
                Leftovers::Mine { whole_uid } => {
                    descends(p.pid, me)
                        || (whole_uid
                            && !ancestors.contains(&p.pid)
                            && p.uids[..3].contains(&my_uid))
                }
            })
            .cloned()
            .collect()
    }
}

/// Kills every process `scope` covers and waits, at most `within`, until none is left.
/// Blocking: it sleeps between rounds (call it off the async threads, or where a short block
/// is fine). Reaps the ones it killed that were its own children (adopted orphans).
///
/// # Errors
/// [`Survivors`] when some still run after `within`.
pub fn kill_all(scope: Leftovers, within: Duration) -> Result<usize, Survivors> {
    let me = std::process::id().cast_signed();
    let my_uid = nix::unistd::geteuid().as_raw();
    let give_up = Instant::now() + within;
    let mut killed = BTreeSet::new();
    loop {
        let found = scope.select(&processes(), me, my_uid);
        for zombie in found.iter().filter(|p| p.dead() && p.ppid == me) {
            let _ = waitpid(Pid::from_raw(zombie.pid), Some(WaitPidFlag::WNOHANG));
        }
        let alive: Vec<i32> = found.iter().filter(|p| !p.dead()).map(|p| p.pid).collect();
        if alive.is_empty() {
            return Ok(killed.len());
        }
        if Instant::now() >= give_up {
            return Err(Survivors {
                pids: alive,
                within,
            });
        }
        // Stopped first, all of them, so none forks a child this round does not see.
        for &pid in &alive {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        }
        for &pid in &alive {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed.insert(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Makes this process the subreaper of its descendants: one that detaches from its parent
/// (`setsid`, a double fork) is adopted by this process instead of init, so it stays within
/// [`Leftovers::Mine`]'s reach.
pub fn adopt_orphans() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::error!(error = %e, "could not adopt orphaned processes: a detached process a job leaves may outlive it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, uid: u32) -> Proc {
        Proc {
            pid,
            ppid,
            state: 'S',
            uids: [uid; 4],
        }
    }

    /// init(1) ─ shell(10, uid 7) ─ runner(20, uid 7) ─ terraform(30) ─ provider(40)
    ///          ├ adopted orphan(50, parent 20)        ├ other user's child(60, uid 9)
    ///          └ unrelated(70, uid 7) and root's daemon(80, uid 0)
    fn tree() -> Vec<Proc> {
        vec![
            p(1, 0, 0),
            p(10, 1, 7),
            p(20, 10, 7),
            p(30, 20, 7),
            p(40, 30, 7),
            p(50, 20, 7),
            p(60, 20, 9),
            p(70, 1, 7),
            p(80, 1, 0),
        ]
    }

    fn pids(found: &[Proc]) -> Vec<i32> {
        found.iter().map(|p| p.pid).collect()
    }

    #[test]
    fn a_runners_own_leftovers_are_its_descendants_and_never_itself_or_its_ancestors() {
        let mine = Leftovers::Mine { whole_uid: false };
        assert_eq!(pids(&mine.select(&tree(), 20, 7)), [30, 40, 50, 60]);
        // In a sandbox of its own: every other process of its uid too, never its parent shell.
        let sole = Leftovers::Mine { whole_uid: true };
        assert_eq!(pids(&sole.select(&tree(), 20, 7)), [30, 40, 50, 60, 70]);
    }

    #[test]
    fn a_jobs_user_covers_every_process_of_that_uid_and_never_root() {
        assert_eq!(
            pids(&Leftovers::User(7).select(&tree(), 20, 0)),
            [10, 30, 40, 50, 70]
        );
        assert!(Leftovers::User(0).select(&tree(), 20, 0).is_empty());
        // A process that changed only its effective uid is the user's still.
        let mut setuid = p(90, 1, 0);
        setuid.uids[1] = 7;
        assert_eq!(pids(&Leftovers::User(7).select(&[setuid], 20, 0)), [90]);
    }

    #[test]
    fn a_cycle_in_a_changing_process_table_ends_the_walk() {
        let looped = vec![p(30, 31, 7), p(31, 30, 7)];
        assert!(
            Leftovers::Mine { whole_uid: false }
                .select(&looped, 20, 7)
                .is_empty()
        );
    }

    #[test]
    fn proc_shows_this_process_with_its_parent_and_uid() {
        let me = Proc::read(std::process::id().cast_signed()).expect("/proc/self");
        assert_eq!(me.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(me.uids[0], nix::unistd::getuid().as_raw());
        assert!(!me.dead());
    }
}
