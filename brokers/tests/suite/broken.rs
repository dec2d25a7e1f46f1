//! Deliberately broken adapters: wrappers around a real broker's factory whose consumer
//! breaks one rule. A test runs a clause against each and requires the clause to fail,
//! proving the suite can catch the fault.

use async_trait::async_trait;
use dedup_brokers::{Action, BrokerError, ConsumerConfig, Delivery, Pending, Shutdown, Source};

use super::{BrokerFactory, DeadLetter};

/// Acks every delivery as soon as it is fetched, before its handler ran: a crash or a
/// retry then loses the message.
pub struct AcksBeforeHandling<F>(pub F);

/// Hands every delivery to the loop without its message id.
pub struct DropsMessageId<F>(pub F);

/// The consumer of [`AcksBeforeHandling`].
pub struct AcksFirst<S>(S);

/// A delivery already acked: settling it does nothing.
pub struct Acked(Delivery);

#[async_trait]
impl Pending for Acked {
    fn delivery(&self) -> &Delivery {
        &self.0
    }

    async fn settle(self, _action: Action, _shutdown: &Shutdown) -> Result<(), BrokerError> {
        Ok(())
    }
}

#[async_trait]
impl<S: Source> Source for AcksFirst<S> {
    type Pending = Acked;

    fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.0.connect(config).await
    }

    async fn fetch(&mut self, max: usize, shutdown: &Shutdown) -> Result<Vec<Acked>, BrokerError> {
        let mut out = Vec::new();
        for pending in self.0.fetch(max, shutdown).await? {
            let delivery = pending.delivery().clone();
            pending.settle(Action::Ack, shutdown).await?;
            out.push(Acked(delivery));
        }
        Ok(out)
    }

    async fn stop(&mut self) {
        self.0.stop().await
    }

    async fn give_back(&mut self) {
        self.0.give_back().await
    }
}

/// The consumer of [`DropsMessageId`].
pub struct NoIds<S>(S);

/// A delivery whose message id was dropped.
pub struct NoId<P> {
    inner: P,
    delivery: Delivery,
}

#[async_trait]
impl<P: Pending> Pending for NoId<P> {
    fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError> {
        self.inner.settle(action, shutdown).await
    }
}

#[async_trait]
impl<S: Source> Source for NoIds<S> {
    type Pending = NoId<S::Pending>;

    fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.0.connect(config).await
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<Self::Pending>, BrokerError> {
        let fetched = self.0.fetch(max, shutdown).await?;
        Ok(fetched
            .into_iter()
            .map(|inner| {
                let delivery = Delivery {
                    message_id: None,
                    ..inner.delivery().clone()
                };
                NoId { inner, delivery }
            })
            .collect())
    }

    async fn stop(&mut self) {
        self.0.stop().await
    }

    async fn give_back(&mut self) {
        self.0.give_back().await
    }
}

/// Asks the broker for four times what the loop asked: the loop, not the source, must keep
/// the in-flight bound (the bound clause must still pass).
pub struct FetchesPastTheBound<F>(pub F);

/// The consumer of [`FetchesPastTheBound`].
pub struct Greedy<S>(S);

#[async_trait]
impl<S: Source> Source for Greedy<S> {
    type Pending = S::Pending;

    fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.0.connect(config).await
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<S::Pending>, BrokerError> {
        self.0.fetch(max * 4, shutdown).await
    }

    async fn stop(&mut self) {
        self.0.stop().await
    }

    async fn give_back(&mut self) {
        self.0.give_back().await
    }
}

/// Dead-letters without the failure headers the loop built: the copy says nothing of why.
pub struct DropsFailureHeaders<F>(pub F);

/// The consumer of [`DropsFailureHeaders`].
pub struct NoCause<S>(S);

/// A delivery whose dead-lettering loses the failure headers.
pub struct Causeless<P>(P);

#[async_trait]
impl<P: Pending> Pending for Causeless<P> {
    fn delivery(&self) -> &Delivery {
        self.0.delivery()
    }

    async fn settle(self, action: Action, shutdown: &Shutdown) -> Result<(), BrokerError> {
        let action = match action {
            Action::DeadLetter { reason, .. } => Action::DeadLetter {
                reason,
                headers: Vec::new(),
            },
            other => other,
        };
        self.0.settle(action, shutdown).await
    }
}

#[async_trait]
impl<S: Source> Source for NoCause<S> {
    type Pending = Causeless<S::Pending>;

    fn endpoint(&self) -> &str {
        self.0.endpoint()
    }

    async fn connect(&mut self, config: &ConsumerConfig) -> Result<(), BrokerError> {
        self.0.connect(config).await
    }

    async fn fetch(
        &mut self,
        max: usize,
        shutdown: &Shutdown,
    ) -> Result<Vec<Self::Pending>, BrokerError> {
        let fetched = self.0.fetch(max, shutdown).await?;
        Ok(fetched.into_iter().map(Causeless).collect())
    }

    async fn stop(&mut self) {
        self.0.stop().await
    }

    async fn give_back(&mut self) {
        self.0.give_back().await
    }
}

/// Delegates everything but the source to the wrapped factory.
macro_rules! wrapped_factory {
    ($factory:ident, $source:ident) => {
        #[async_trait]
        impl<F: BrokerFactory> BrokerFactory for $factory<F> {
            type Source = $source<F::Source>;

            async fn new() -> Option<Self> {
                F::new().await.map($factory)
            }

            async fn publish(&self, ids: &[String]) {
                self.0.publish(ids).await
            }

            async fn publish_without_id(&self, payload: &[u8]) {
                self.0.publish_without_id(payload).await
            }

            async fn source(&self, worker: &str, config: &ConsumerConfig) -> Self::Source {
                $source(self.0.source(worker, config).await)
            }

            async fn kill(&self, worker: &str) {
                self.0.kill(worker).await
            }

            async fn dead_letters(&self) -> Vec<DeadLetter> {
                self.0.dead_letters().await
            }

            async fn outstanding(&self) -> u64 {
                self.0.outstanding().await
            }

            async fn cleanup(self) {
                self.0.cleanup().await
            }
        }
    };
}

wrapped_factory!(AcksBeforeHandling, AcksFirst);
wrapped_factory!(DropsMessageId, NoIds);
wrapped_factory!(FetchesPastTheBound, Greedy);
wrapped_factory!(DropsFailureHeaders, NoCause);

/// Run `clause` and require it to fail (panic).
pub async fn must_fail<Fut>(what: &str, clause: Fut)
where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(clause).await;
    assert!(
        outcome.is_err_and(|e| e.is_panic()),
        "the suite did not catch {what}"
    );
}
