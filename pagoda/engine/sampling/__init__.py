"""What a request asks of the sampler: the table of sampling fields (fields), and the
per-request parameters built on it (params: SamplingParams, StructuredOutputsParams,
PoolingParams). No torch."""
