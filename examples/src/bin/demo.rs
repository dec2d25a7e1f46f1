//! The main demo (placeholder until the examples issue): one message delivered twice,
//! processed once.

use dedup_core::{Handled, Inbox, Key, MemoryStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let inbox = Inbox::new(MemoryStore::new());
    let key = Key::new("billing", "order-42")?;
    let mut charges = 0;
    for delivery in 1..=2 {
        let result = inbox
            .handle(&key, None, |_lease| async {
                charges += 1;
                Ok::<_, std::io::Error>(Some(b"charged".to_vec()))
            })
            .await?;
        let what = match result {
            Handled::Processed { .. } => "processed",
            Handled::Duplicate { .. } => "duplicate, skipped",
            Handled::Busy { .. } => "busy",
        };
        println!("delivery {delivery}: {what}");
    }
    println!("charges: {charges}");
    Ok(())
}
