"""Search-hotword prediction: segmentation, TF-IDF and context features around a small MLP."""
