//! The README's first example: one message delivered twice, charged once.
use dedup::{BoxError, Handled, Inbox, Key};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The embedded default: an SQLite file, created on first use.
    let path = std::env::temp_dir().join("dedup-quickstart.db");
    let store = dedup::open(&format!("sqlite:{}", path.display())).await?;
    let inbox = Inbox::new(store);

    // The broker delivers order 42 twice; each delivery goes through the inbox.
    let key = Key::new("billing", "order-42")?;
    let mut answers = Vec::new();
    for delivery in 1..=2 {
        let handled = inbox
            .handle(&key, None, |_lease| async {
                // Charge the card here, with `_lease.idempotency_key()` for the provider.
                println!("charging order 42");
                Ok::<_, BoxError>(Some(b"charged".to_vec()))
            })
            .await?;
        match &handled {
            Handled::Processed { .. } => println!("delivery {delivery}: processed"),
            Handled::Duplicate { .. } => println!("delivery {delivery}: duplicate, not charged"),
            other => println!("delivery {delivery}: {other:?}"),
        }
        answers.push(handled);
    }
    // The second delivery is always a duplicate (run it again: both are).
    assert!(matches!(answers[1], Handled::Duplicate { .. }));
    Ok(())
}
