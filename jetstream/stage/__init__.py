"""The Spark local stage: compiling the expression IR to Spark and the Structured Streaming job."""
