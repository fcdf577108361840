"""Device time reservations: pure booking rules (`book`) and the JetStream KV store (`store`)."""
