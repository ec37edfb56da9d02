"""What applications call: the producer, the consumer, the consume-result writer and the dead-letter queries a notebook uses."""
