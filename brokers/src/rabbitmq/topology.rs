//! [`Topology`]: a queue with its dead-letter exchange and queue, declared on request; and
//! the start-up check that a queue dead-letters somewhere.

use std::time::{SystemTime, UNIX_EPOCH};

use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ErrorKind, ExchangeKind};

use super::errors::classify;
use crate::BrokerError;

/// The queue argument naming where RabbitMQ moves a rejected message.
pub const DEAD_LETTER_EXCHANGE_ARG: &str = "x-dead-letter-exchange";

/// A consumer's queue with its dead-letter exchange and the queue behind it, all durable:
/// [`declare`](Self::declare) makes them (or finds them as they are), so that a message the
/// consumer rejects (RabbitMQ's [`DeadLetters::QueueDlx`](super::DeadLetters::QueueDlx))
/// lands in [`dead_letter_queue`](Self::dead_letter_queue) instead of being dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The queue consumed; declared with `x-dead-letter-exchange` = the exchange below.
    pub queue: String,
    /// The dead-letter exchange (`fanout`).
    pub dead_letter_exchange: String,
    /// The queue bound to it, which keeps the dead letters.
    pub dead_letter_queue: String,
}

impl Topology {
    /// `queue`, its dead-letter exchange `<queue>.dlx` and dead-letter queue `<queue>.dead`.
    pub fn for_queue(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Topology {
            dead_letter_exchange: format!("{queue}.dlx"),
            dead_letter_queue: format!("{queue}.dead"),
            queue,
        }
    }

    /// Declare the exchange, the dead-letter queue and its binding, then the queue. Doing
    /// it again changes nothing. A queue that exists with other arguments (another
    /// dead-letter exchange, none) is refused by RabbitMQ (`PRECONDITION_FAILED`, closing
    /// `channel`): [`BrokerError::Refused`].
    pub async fn declare(&self, channel: &Channel) -> Result<(), BrokerError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                let what = format!("declaring exchange {}", self.dead_letter_exchange);
                classify(what, e)
            })?;
        channel
            .queue_declare(
                self.dead_letter_queue.as_str().into(),
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify(format!("declaring queue {}", self.dead_letter_queue), e))?;
        channel
            .queue_bind(
                self.dead_letter_queue.as_str().into(),
                self.dead_letter_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                let what = format!(
                    "binding queue {} to {}",
                    self.dead_letter_queue, self.dead_letter_exchange
                );
                classify(what, e)
            })?;
        let mut args = FieldTable::default();
        args.insert(
            DEAD_LETTER_EXCHANGE_ARG.into(),
            text(&self.dead_letter_exchange),
        );
        channel
            .queue_declare(self.queue.as_str().into(), durable, args)
            .await
            .map_err(|e| {
                let what = format!(
                    "declaring queue {} with {DEAD_LETTER_EXCHANGE_ARG} {}",
                    self.queue, self.dead_letter_exchange
                );
                classify(what, e)
            })?;
        Ok(())
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// At most this many probing declares (each learns one flag or argument of the queue).
const PROBES: usize = 12;

/// Refuse `queue` when it has no `x-dead-letter-exchange` argument.
///
/// AMQP cannot read a queue's arguments; RabbitMQ's answer to a declare with arguments the
/// queue does not have says what they are. So: a passive declare (the queue must exist),
/// then declares naming a dead-letter exchange the queue cannot have (a fresh name), each
/// on a channel of its own (the refusal closes it). The answer names the first difference:
/// `durable` or `auto_delete` (flipped for the next probe), an argument RabbitMQ compares
/// before the dead-letter exchange (copied from the answer for the next probe), or the
/// dead-letter exchange: `current is none` means the queue has none. A declare that
/// succeeds made the queue (it was deleted meanwhile): it is deleted again and the queue
/// reported missing. Tested against RabbitMQ 3.10.
pub(crate) async fn check_dead_letter_exchange(
    connection: &Connection,
    queue: &str,
) -> Result<(), BrokerError> {
    let context = || format!("checking that queue {queue} has a dead-letter exchange");
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| classify(context(), e))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .map_err(|e| classify(format!("queue {queue}"), e))?;
    let _ = channel.close(200, "checked".into()).await;

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let probe = format!("dedup-probe-{}-{nanos}", std::process::id());
    let mut options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let mut args = FieldTable::default();
    args.insert(DEAD_LETTER_EXCHANGE_ARG.into(), text(&probe));
    for _ in 0..PROBES {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| classify(context(), e))?;
        let error = match channel
            .queue_declare(queue.into(), options, args.clone())
            .await
        {
            Ok(_) => {
                let unused = QueueDeleteOptions {
                    if_unused: true,
                    if_empty: true,
                    ..QueueDeleteOptions::default()
                };
                let _ = channel.queue_delete(queue.into(), unused).await;
                let _ = channel.close(200, "checked".into()).await;
                return Err(BrokerError::refused(
                    context(),
                    format!("queue {queue} does not exist (it was deleted while checked)"),
                ));
            }
            Err(e) => e,
        };
        let answer = match error.kind() {
            ErrorKind::ProtocolError(e) => e.get_message().as_str().to_owned(),
            _ => return Err(classify(context(), error)),
        };
        match Difference::read(&answer) {
            Some(Difference::DeadLetterExchange { present: true }) => return Ok(()),
            Some(Difference::DeadLetterExchange { present: false }) => {
                return Err(BrokerError::MissingTopology {
                    endpoint: queue.to_owned(),
                    missing: DEAD_LETTER_EXCHANGE_ARG.to_owned(),
                    why: "the consumer dead-letters by rejecting (DeadLetters::QueueDlx) and \
                          RabbitMQ drops a rejected message of a queue without one; declare it \
                          (RabbitConsumer::declare), dead-letter by publishing \
                          (DeadLetters::Publish), or, when a policy sets it, skip this check \
                          (RabbitConsumer::dead_letter_exchange_by_policy)"
                        .to_owned(),
                });
            }
            Some(Difference::Durable) => options.durable = !options.durable,
            Some(Difference::AutoDelete) => options.auto_delete = !options.auto_delete,
            Some(Difference::Argument { name, value }) => {
                args.insert(name.as_str().into(), value);
            }
            None => return Err(BrokerError::refused(context(), error)),
        }
    }
    Err(BrokerError::refused(
        context(),
        format!("no answer named the dead-letter exchange after {PROBES} probes"),
    ))
}

/// The first difference RabbitMQ reported between a declare and the queue.
#[derive(Debug, PartialEq)]
enum Difference {
    Durable,
    AutoDelete,
    /// The queue has an argument the declare lacked: its value.
    Argument {
        name: String,
        value: AMQPValue,
    },
    /// The dead-letter exchange differs: whether the queue has one at all.
    DeadLetterExchange {
        present: bool,
    },
}

impl Difference {
    /// From `inequivalent arg 'NAME' for queue 'Q' in vhost 'V': received X but current is Y`,
    /// where Y is `none` or `the value 'VALUE' of type 'TYPE'`.
    fn read(answer: &str) -> Option<Difference> {
        let rest = answer.split_once("inequivalent arg '")?.1;
        let (name, rest) = rest.split_once('\'')?;
        let current = rest.rsplit_once("but current is ")?.1;
        match name {
            "durable" => return Some(Difference::Durable),
            "auto_delete" => return Some(Difference::AutoDelete),
            DEAD_LETTER_EXCHANGE_ARG => {
                return Some(Difference::DeadLetterExchange {
                    present: current != "none",
                });
            }
            _ => {}
        }
        let rest = current.strip_prefix("the value '")?;
        let (value, kind) = rest.rsplit_once("' of type '")?;
        let kind = kind.strip_suffix('\'')?;
        let value = match kind {
            "longstr" | "shortstr" => text(value),
            "bool" => AMQPValue::Boolean(value.parse().ok()?),
            "long" | "signedint" | "short" | "byte" | "unsignedbyte" | "unsignedshort"
            | "unsignedint" | "timestamp" => AMQPValue::LongLongInt(value.parse().ok()?),
            _ => return None,
        };
        Some(Difference::Argument {
            name: name.to_owned(),
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_answers_are_read() {
        let prefix = "PRECONDITION_FAILED - inequivalent arg";
        let read = |rest: &str| Difference::read(&format!("{prefix} {rest}"));
        assert_eq!(
            read(
                "'x-dead-letter-exchange' for queue 'q' in vhost '/': received the value 'p' of type 'longstr' but current is none"
            ),
            Some(Difference::DeadLetterExchange { present: false })
        );
        assert_eq!(
            read(
                "'x-dead-letter-exchange' for queue 'q' in vhost '/': received the value 'p' of type 'longstr' but current is the value '' of type 'longstr'"
            ),
            Some(Difference::DeadLetterExchange { present: true })
        );
        assert_eq!(
            read("'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"),
            Some(Difference::Durable)
        );
        assert_eq!(
            read(
                "'x-message-ttl' for queue 'q' in vhost '/': received none but current is the value '60000' of type 'signedint'"
            ),
            Some(Difference::Argument {
                name: "x-message-ttl".into(),
                value: AMQPValue::LongLongInt(60000)
            })
        );
        assert_eq!(Difference::read("ACCESS_REFUSED - no access"), None);
    }
}
