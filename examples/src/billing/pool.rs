//! The `billing` program's handler pool: concurrent workers taking deliveries off one
//! queue, as competing consumers of a broker queue do.

use std::future::Future;
use std::sync::{Arc, Mutex};

/// What a handler returns.
pub type BoxResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Run `handler` for each delivery on a pool of `workers` concurrent tasks. Each call gets
/// its own handle on `world` and the delivery's message id.
pub async fn deliver<W, F, Fut>(
    world: &Arc<W>,
    deliveries: &[&'static str],
    workers: usize,
    handler: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    W: Send + Sync + 'static,
    F: Fn(Arc<W>, &'static str) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = BoxResult> + Send,
{
    let queue = Arc::new(Mutex::new(deliveries.to_vec()));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (queue, handler, world) = (Arc::clone(&queue), handler.clone(), Arc::clone(world));
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().expect("lock").pop();
                match next {
                    Some(message_id) => handler(Arc::clone(&world), message_id).await?,
                    None => return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(()),
                }
            }
        }));
    }
    for task in tasks {
        task.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}
