//! Best-of rounds: the contenders of a measure run in turns, and the fastest run of each
//! is kept.

use std::time::Duration;

use futures::future::BoxFuture;

use super::driver::Run;
use super::{MAX_ROUNDS, Params, Result};

/// A measured run by round number, as [`best_of`] takes them.
pub(crate) type Contender<'a> = Box<dyn Fn(usize) -> BoxFuture<'static, Result<Run>> + 'a>;

pub(crate) fn contender<'a>(
    run: impl Fn(usize) -> BoxFuture<'static, Result<Run>> + 'a,
) -> Contender<'a> {
    Box::new(run)
}

/// Run the contenders in rounds, rotating which goes first, at least `params.rounds`
/// times and on until they ran `params.min_secs` together (at most [`MAX_ROUNDS`]); the
/// fastest run of each, in the contenders' order.
pub(crate) async fn best_of(params: &Params, contenders: Vec<Contender<'_>>) -> Result<Vec<Run>> {
    let n = contenders.len();
    let mut best: Vec<Option<Run>> = (0..n).map(|_| None).collect();
    let mut spent = Duration::ZERO;
    let mut round = 0;
    while round < params.rounds.max(1)
        || (spent.as_secs_f64() < params.min_secs && round < MAX_ROUNDS)
    {
        for k in 0..n {
            let which = (round + k) % n;
            let run = contenders[which](round).await?;
            spent += run.elapsed;
            if best[which].as_ref().is_none_or(|b| run.elapsed < b.elapsed) {
                best[which] = Some(run);
            }
        }
        round += 1;
    }
    Ok(best.into_iter().flatten().collect())
}
