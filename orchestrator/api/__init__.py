"""The API's requests: submissions, status and cancel queries, the pipeline listing."""
