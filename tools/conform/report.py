def markdown(result):
    return ""
